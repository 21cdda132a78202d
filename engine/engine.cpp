#include "engine/engine.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <unordered_map>

#include "comm/topology.h"
#include "core/clock.h"
#include "core/errors.h"
#include "core/log.h"
#include "engine/offload_rules.h"
#include "engine/detail/engine_impl.h"
#include "nn/flops.h"
#include "nn/layers.h"
#include "nn/threads.h"

namespace zs::engine {

namespace {

// The schedule's base lr is the optimizer's lr, always: a config built in C++ sets the optimizer's
// params only (parse_config copies it too), and a second copy to keep in sync would go stale.
optim::LrScheduleConfig schedule_config(const EngineConfig& cfg) {
  optim::LrScheduleConfig s = cfg.scheduler;
  s.base_lr = cfg.optimizer.lr();
  return s;
}

// Note [expert parameters] (the rule is documented in engine/engine.h and docs/design.md).
// The edp group of E is the expert-data-parallel group of a comm::Topology over the data-parallel
// group with expert_parallel_size E (DeepSpeed's layout: ranks with the same index in consecutive
// groups of E ranks, {i, i+E, i+2E, ...}, ordered by dp rank). A simulated dp group (the estimator)
// gets a simulated edp group of the same members and hosts, so the estimator runs this very code. Every rank must declare expert parameters of the same sizes E (checked here, before
// the collective split, so that a mismatch is an error on every rank instead of a hang).
std::unique_ptr<comm::Group> make_expert_group(const comm::Group& dp, int e) {
  if (!dp.is_mpi()) {
    std::vector<int> members;  // {i, i+E, ...}: the split's members, with their hosts (the projection's bytes)
    for (int j = dp.rank() % e; j < dp.size(); j += e) members.push_back(j);
    return std::make_unique<comm::Group>(dp.simulated_subgroup(members, "edp"));
  }
  return std::make_unique<comm::Group>(comm::Topology::make_expert_data_parallel(dp, {.expert_parallel_size = e}));
}

void check_expert_sizes(const comm::Group& group, const std::vector<int>& sizes, const EngineConfig& cfg) {
  constexpr size_t kMaxSizes = 7;
  for (int e : sizes) {
    if (group.size() % e != 0) {
      throw ModelError(fmt::format("the model has parameters with expert_parallel_size {}, which does not divide the "
                                   "data-parallel world size {}: expert parallelism needs world % expert_parallel_size "
                                   "== 0; run on a multiple of {} ranks or choose an expert_parallel_size that divides {}",
                                   e, group.size(), e, group.size()));
    }
  }
  // A dense model makes no collective here (a rank whose model has experts while another's has none
  // meets the comm layer's mismatch check at its first collective).
  if (sizes.empty()) return;
  if (sizes.size() > kMaxSizes) {
    throw ModelError(fmt::format("the model has parameters of {} different expert_parallel_size values; zeroshard "
                                 "supports at most {}", sizes.size(), kMaxSizes));
  }
  if (cfg.optimizer.compressed() && !sizes.empty()) {
    throw ConfigError(fmt::format("optimizer.type: {} with expert parameters (expert_parallel_size {}) is not supported "
                                  "by zeroshard yet: its compressed allreduce averages one whole momentum over the "
                                  "data-parallel group, while experts are reduced over their expert-data-parallel "
                                  "group; use Adam/AdamW, Lamb or Lion with MoE models",
                                  cfg.optimizer.name(), sizes.front()));
  }
  if (!group.is_mpi() || group.size() == 1) return;
  // Every rank must form the same edp groups: the split below is collective.
  std::vector<float> mine(kMaxSizes + 1, 0.0f);
  mine[0] = static_cast<float>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) mine[i + 1] = static_cast<float>(sizes[i]);
  std::vector<float> all(mine.size() * static_cast<size_t>(group.size()));
  group.allgather(memory::Tensor::of(std::span<float>(mine)), memory::Tensor::of(std::span<float>(all)));
  for (int r = 0; r < group.size(); ++r) {
    if (!std::equal(mine.begin(), mine.end(), all.begin() + static_cast<ptrdiff_t>(r * mine.size()))) {
      throw ModelError(fmt::format("rank {} has expert parameters of {} expert_parallel_size value(s) ({}), but rank {} "
                                   "has a different set: every rank must declare the same MoE layers",
                                   group.rank(), sizes.size(), fmt::join(sizes, ", "), r));
    }
  }
}

// Note [tensor-parallel parameters] (engine/engine.h): every TP shard must be a slice of the tensor-
// parallel group the engine was given (parts its size, index this rank's), so the tp ranks' layouts
// line up and a model built for another degree is refused before any collective.
void check_tensor_slices(const std::vector<nn::Parameter*>& params, const comm::Group* tp, const EngineConfig& cfg) {
  const int size = tp != nullptr ? tp->size() : 1;
  const int rank = tp != nullptr ? tp->rank() : 0;
  for (const nn::Parameter* p : params) {
    const nn::TensorSlice& s = p->tensor_slice();
    if (s.whole()) continue;
    if (s.parts != size || s.index != rank) {
      throw ModelError(fmt::format(
          "parameter '{}' is tensor-parallel slice {} of {}, but the engine runs with a tensor-parallel group of {} "
          "rank(s){}: build the model with the same group the engine is given (the Engine constructor with "
          "`tensor_parallel`; model.tensor_parallel_size for the built-in GPT)",
          p->full_name(), s.index, s.parts, size, size > 1 ? fmt::format(" (this is its rank {})", rank) : std::string()));
    }
  }
  if (size > 1 && cfg.optimizer.compressed()) {
    throw ConfigError(fmt::format(
        "optimizer.type: {} with model.tensor_parallel_size {} is not supported: its compressed allreduce scales "
        "each chunk of the whole momentum by one value, and chunks mixing TP shards and replicated parameters would "
        "let the tensor-parallel replicas drift apart; use Adam/AdamW, Lamb or Lion with tensor parallelism, or "
        "model.tensor_parallel_size 1",
        cfg.optimizer.name(), size));
  }
}

// The parameters by partition group, and the expert-data-parallel groups of their E > 1 (into
// `expert_groups`, in the order of the returned sets after the dense one). Collective over `group`
// when the model has expert parameters.
std::vector<std::unique_ptr<ModelStates>> make_sets(nn::Model& model, const EngineConfig& cfg, const comm::Group& group,
                                                 const comm::Group* tp,
                                                 std::vector<std::unique_ptr<comm::Group>>& expert_groups,
                                                 std::unique_ptr<ZeroppGroups>& zeropp_groups) {
  nn::assign_names(model);
  const std::vector<nn::Parameter*> params = model.all_params();
  check_tensor_slices(params, tp, cfg);
  std::vector<ParamGroup> groups = group_by_expert_parallel_size(params);
  const PlacementRules rules = placement_rules(cfg);
  std::vector<int> sizes;
  for (size_t g = 1; g < groups.size(); ++g) sizes.push_back(groups[g].expert_parallel_size);
  check_expert_sizes(group, sizes, cfg);
  std::vector<std::unique_ptr<ModelStates>> sets;
  zeropp_groups = make_zeropp_groups(group, cfg.zero, groups.size() > 1 ? groups[1].expert_parallel_size : 0);
  sets.push_back(std::make_unique<ModelStates>(std::move(groups[0]), group, rules));
  sets.back()->zeropp = zeropp_groups.get();
  for (size_t g = 1; g < groups.size(); ++g) {
    expert_groups.push_back(make_expert_group(group, groups[g].expert_parallel_size));
    sets.push_back(std::make_unique<ModelStates>(std::move(groups[g]), *expert_groups.back(), rules));
  }
  return sets;
}

// comm.shared_arena: the device arena in memory the node's other ranks map (Note [Direct collectives]
// in comm/detail/shm_direct.h), when the ranks can use it. The same on every rank of the group.
bool wants_shared_arena(const EngineConfig& cfg, const comm::Group& group) {
  return cfg.comm.shared_arena && cfg.comm.shared_memory != comm::SharedMemory::kOff && group.is_mpi() &&
         group.size() > 1;
}

}  // namespace

Engine::Impl::Impl(nn::Model& model, const EngineConfig& cfg, const comm::Group& group, const comm::Group* tp,
                   std::unique_ptr<memory::Backend> backend)
    : cfg_(cfg),
      group_(group),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      sets_(make_sets(model, cfg, group, tp_, expert_groups_, zeropp_groups_)),
      plan_(sets_.front()->plan),
      stage_(cfg.zero.stage),
      grad_stage_(plan_.grad_stage),
      dtype_(cfg.compute_dtype()),
      arena_(std::make_shared<DeviceArena>(
          backend ? std::move(backend)
                  : memory::make_backend(cfg.device.backend, static_cast<size_t>(cfg.device.memory_mb) << 20,
                                         wants_shared_arena(cfg, group)))),
      tracker_(arena_->tracker),
      backend_(arena_->backend.get()),
      device_(&arena_->allocator),
      optimizer_(cfg.optimizer.make()),  // nullptr: compressed_step.cpp drives the one-bit optimizers' kernels itself
      schedule_(schedule_config(cfg)),
      scaler_(cfg.precision == Precision::kFp16 ? optim::LossScaler(cfg.loss_scaler) : optim::LossScaler()),
      env_(cfg, *backend_, *device_, tracker_, optimizer_.get(), group.rank(), std::max(1, nn::compute_threads()), tp_),
      ctx_(arena_, *this) {
  if (wants_shared_arena(cfg, group)) {  // collective over the group; the same condition on every rank
    shared_arena_ = comm::SharedArena(group, backend_->shared_mapping(device_->base()));
    if (group.rank() == 0 && shared_arena_.active()) {
      ZS_LOG_INFO("comm.shared_arena: collectives on the device arena read the peers' tensors in place");
    } else if (group.rank() == 0) {
      ZS_LOG_INFO("comm.shared_arena: collectives stay staged through the shared-memory window: {}",
                  shared_arena_.inactive_reason());
    }
  }
  // device.alloc_trace is recorded on world rank 0 from here (the allocations so far are the arena's
  // own); whether its file can be written is checked at the end of this constructor.
  const bool writes_alloc_trace = !cfg.device.alloc_trace.empty() && group.rank() == 0 && (tp_ == nullptr || tp_->rank() == 0);
  if (writes_alloc_trace) arena_->record_trace();
  backend_->set_threads(env_.threads());
  const bool optimizer_on_nvme = cfg.zero.offload_optimizer.device == OffloadDevice::kNvme;
  const bool params_on_nvme = cfg.zero.offload_param.device == OffloadDevice::kNvme;
  if (optimizer_ && optimizer_->tensor_sums() > 0 && (optimizer_on_nvme || params_on_nvme)) {
    // Note [two-pass step] in model_states_step.cpp: the NVMe step streams each sub-group through once.
    throw ConfigError(fmt::format("optimizer.type: {} needs each parameter tensor's norms before it can update any part of "
                                  "it, a second pass over the swap files that zeroshard's NVMe offload does not make yet; "
                                  "use zero_optimization.offload_optimizer/offload_param device \"cpu\" or \"none\", "
                                  "or an elementwise optimizer such as AdamW with NVMe",
                                  optimizer_->name()));
  }
  if (optimizer_) {
    ZS_ASSERT(optimizer_->state_specs().size() <= kMaxStates, "{} keeps {} states (at most {})", optimizer_->name(),
              optimizer_->state_specs().size(), kMaxStates);
  }
  try {
    setup_pipeline(model);
    // Before placement, whose failures (a rank out of device memory, say) are rank-local: from here
    // to the end of the constructor only the sets' own collectives run, so a rank that throws meets
    // its peers in the caller's error agreement (Note [errors across ranks] in
    // tools/train_command.cpp). A measuring engine (the estimator's) keeps its process's choice: its
    // groups move nothing.
    if (kernels() && cfg.precision == Precision::kBf16) agree_bf16_products();
    place_all(model);
    setup_recompute(model);
    if (writes_alloc_trace && !std::ofstream(cfg.device.alloc_trace)) {
      // Fail now, not after the run, when the trace cannot be written; and only here, after the
      // constructor's last collective (the shared arena's registration, the bf16 vote, ZeRO-3's shared shards):
      // rank 0 failing before one of them left the others in it while rank 0 waited in the
      // caller's error agreement (a hang, then a mismatch error, e2e_bad_alloc_trace_unwritable).
      throw ConfigError(fmt::format("device.alloc_trace: cannot write '{}'; check that its directory exists and is writable",
                                    cfg.device.alloc_trace));
    }
  } catch (...) {
    sets_.clear();  // as ~Impl, which does not run for a constructor that throws
    throw;
  }
}

void Engine::Impl::agree_bf16_products() {
  // Counts over the world: the grid's groups summed one after the other reach every rank once.
  const nn::Bf16ProductsVote vote = nn::bf16_products_vote();
  std::array<float, 3> counts = {vote.kernel_allowed ? 1.0f : 0.0f, vote.kernel_chosen ? 1.0f : 0.0f, 1.0f};
  const memory::Tensor t = memory::Tensor::of(std::span<float>(counts));
  if (group_.size() > 1) group_.allreduce(t);
  if (tp_ != nullptr) tp_->allreduce(t);
  if (pipeline_ != nullptr && pipeline_->pipeline_group().size() > 1) pipeline_->pipeline_group().allreduce(t);
  const bool kernel = counts[0] == counts[2] && counts[1] > 0.0f;
  if (kernel != vote.kernel_chosen) {
    ZS_LOG_WARN("engine: rank {} of the data-parallel group: bf16 products on {} as the job's {} rank(s) agreed ({} may "
                "run the kernel, {} chose it), not this rank's own choice: {}",
                group_.rank(), kernel ? "the avx512bf16 kernel" : "sgemm", counts[2], counts[0], counts[1],
                nn::bf16_products_description());
  }
  nn::agree_bf16_products(kernel);
}

void Engine::Impl::place_all(nn::Model& model) {
  std::optional<CompressedState> compressed;
  if (!optimizer_) compressed.emplace();
  for (auto& s : sets_) s->place(env_, compressed ? &*compressed : nullptr);
  if (compressed) init_compressed(std::move(*compressed));

  std::vector<nn::Module*> modules = model.named_modules();
  for (size_t k = 0; k < sets_.size(); ++k) {
    ModelStates& s = *sets_[k];
    auto slots = s.layout.slots();
    for (size_t i = 0; i < slots.size(); ++i) slot_by_name_[slots[i].param->full_name()] = {k, i};
    s.initialise_and_bind(modules);
  }
}

std::vector<float> Engine::Impl::gather_full(const nn::Parameter& p, std::vector<float> local) const {
  const nn::TensorSlice& slice = p.tensor_slice();
  if (slice.whole() || tp_ == nullptr) return local;
  // Every tp rank's slice (equal sizes), then each into its full positions: rank r's slice is the one
  // with index r (the same dim, parts and stride), mapped by Parameter::for_each_full_run.
  const size_t n = local.size();
  std::vector<float> all(n * static_cast<size_t>(tp_->size()));
  tp_->allgather(memory::Tensor(local.data(), memory::DType::kF32, {static_cast<int64_t>(n)}),
                 memory::Tensor(all.data(), memory::DType::kF32, {static_cast<int64_t>(all.size())}));
  std::vector<float> full(static_cast<size_t>(p.full_numel()));
  for (int r = 0; r < tp_->size(); ++r) {
    nn::Parameter peer(p.name(), p.shape(), p.init());
    nn::TensorSlice piece = slice;
    piece.index = r;
    peer.set_tensor_slice(piece);
    const float* from = all.data() + static_cast<size_t>(r) * n;
    peer.for_each_full_run(0, n, [&](uint64_t local_at, uint64_t full_at, uint64_t count) {
      std::copy_n(from + local_at, count, full.data() + full_at);
    });
  }
  return full;
}

Engine::Impl::~Impl() {
  // The sets' buffers live in the arena, declared after them: they go first (their reducers and
  // gatherers wait for their collectives), while the arena and the expert groups are still there.
  sets_.clear();
}

std::vector<float> Engine::Impl::gather_fp32(const ModelStates& s, const ParamSlot& slot) {
  std::vector<float> out(slot.numel);
  if (stage_ == 0 || s.group.size() == 1) {
    s.read_master(slot.range(), out.data());
    return out;
  }
  memory::ShardRange owned = s.partition.owned(slot.range());
  // Our own part in a separate buffer: allgatherv must not read and write the same memory.
  std::vector<float> mine(owned.size);
  s.read_master(owned, mine.data());
  s.group.allgatherv(memory::Tensor(mine.data(), memory::DType::kF32, {static_cast<int64_t>(mine.size())}),
                     memory::Tensor(out.data(), memory::DType::kF32, {static_cast<int64_t>(out.size())}), s.partition.counts(slot.range()));
  return out;
}

Engine::Engine(nn::Model& model, const EngineConfig& config, const comm::Group& data_parallel)
    : Engine(model, config, data_parallel, nullptr) {}

Engine::Engine(nn::Model& model, const EngineConfig& config, const comm::Group& data_parallel,
               std::unique_ptr<memory::Backend> backend)
    : model_(model), config_(config), group_(data_parallel) {
  start(std::move(backend));
}

Engine::Engine(nn::Model& model, const EngineConfig& config, const comm::Group& data_parallel,
               const comm::Group& tensor_parallel, std::unique_ptr<memory::Backend> backend)
    : model_(model), config_(config), group_(data_parallel), tp_(tensor_parallel.size() > 1 ? &tensor_parallel : nullptr) {
  start(std::move(backend));
}

void Engine::start(std::unique_ptr<memory::Backend> backend) {
  impl_ = std::make_unique<Impl>(model_, config_, group_, tp_, std::move(backend));
  impl_->bytes_sent_at_step_start_ = group_.counters().bytes_sent;
  if (tp_ != nullptr) impl_->tp_bytes_at_step_start_ = tp_->bytes_sent();
  // A measuring engine (the estimator) is one of many made in a row: it says so only when asked.
  if (impl_->kernels()) {
    // Only an engine that trains monitors: a measuring one (the estimator) must not create files.
    // Rank 0 of the job writes: with tensor parallelism the world rank is tp rank + tp x dp rank
    // (comm::Topology's order), so the other tp ranks' dp rank 0 does not write the same files.
    const int pp_rank = impl_->pipeline_ ? impl_->pipeline_->pipeline_group().rank() : 0;
    const int world_rank = tensor_parallel_size() * (group_.rank() + group_.size() * pp_rank) + (tp_ ? tp_->rank() : 0);
    if (TrainingMonitor::wanted(config_)) {
      impl_->monitor_ = std::make_unique<TrainingMonitor>(config_, world_rank);
      if (!impl_->monitor_->trace_file().empty()) group_.start_trace();
    }
    // DeepSpeed profiles on global rank 0 only.
    if (config_.monitor.flops.enabled && world_rank == 0) {
      impl_->profiler_ = std::make_unique<FlopsProfiler>(config_.monitor.flops);
    }
    size_t buckets = 0;
    for (const auto& set : impl_->sets_) buckets += set->reducer->bucket_count();
    ZS_LOG_INFO("engine: {} parameters, ZeRO stage {}, {}, {} on {} rank(s){}, {} gradient buckets averaged in {}, "
                "device arena {} MiB",
                param_count(), config_.zero.stage, config_.optimizer.name(), precision_name(config_.precision), group_.size(),
                tp_ != nullptr ? fmt::format(" x tensor-parallel {} (dp {} x tp {})", tp_->size(), group_.size(), tp_->size())
                               : std::string(),
                buckets, memory::dtype_name(config_.gradient_comm_dtype()), config_.device.memory_mb);
    if (tp_ != nullptr) {
      size_t shards = 0, shard_elements = 0;
      for (const auto& set : impl_->sets_) {
        for (const ParamSlot& slot : set->layout.slots()) {
          if (slot.param->tensor_slice().whole()) continue;
          ++shards;
          shard_elements += slot.numel;
        }
      }
      ZS_LOG_INFO("engine: {} tensor-parallel shard(s) of {} elements on this rank; the other parameters are replicated "
                  "over the tp group and counted once in the gradient norm",
                  shards, shard_elements);
    }
    if (config_.precision == Precision::kBf16) ZS_LOG_INFO("engine: bf16 products on {}", nn::bf16_products_description());
    for (const auto& set : impl_->sets_) {
      if (!set->expert()) continue;
      ZS_LOG_INFO("engine: {} expert parameters on this rank (of expert_parallel_size {}), sharded over an "
                  "expert-data-parallel group of {} rank(s)", set->layout.param_elements(), set->expert_parallel_size(),
                  set->group.size());
    }
  } else {
    ZS_LOG_DEBUG("engine: measuring {} parameters at ZeRO stage {} as rank {} of {}", param_count(), config_.zero.stage,
                 group_.rank(), group_.size());
  }
}

// Note [engine memory lifetime] (engine/detail/engine_context.h), rule 1: the model forgets the
// engine's memory before the engine frees it.
Engine::~Engine() {
  // The end-of-run comms table; not while an error unwinds (the error is what the user must read).
  if (impl_->monitor_ && std::uncaught_exceptions() == 0) {
    try {
      impl_->monitor_->finish(group_.op_stats(), impl_->monitor_->trace_file().empty() ? std::vector<comm::TraceEvent>{} : group_.trace());
    } catch (const std::exception& e) {
      ZS_LOG_WARN("monitor: {}", e.what());
    }
  }
  model_.clear_saved();
  model_.visit_params([](nn::Parameter& p) {
    p.set_data(memory::Tensor());
    p.set_grad(memory::Tensor());
  });
  // device.alloc_trace: the model states are still live here, as they were all run.
  if (const auto& rec = impl_->arena_->trace) {
    try {
      memory::save_trace(rec->trace(), config_.device.alloc_trace);
      ZS_LOG_INFO("device.alloc_trace: {} allocation events written to {}", rec->size(), config_.device.alloc_trace);
    } catch (const std::exception& e) {
      ZS_LOG_WARN("device.alloc_trace: {}", e.what());
    }
  }
}

int64_t Engine::param_count() const {
  size_t n = 0;
  // An expert set holds this rank's experts; the EP group's expert_parallel_size ranks hold one each.
  // A TP shard stands for its whole tp = 1 tensor.
  for (const auto& set : impl_->sets_) {
    size_t elements = set->layout.param_elements();
    if (tp_ != nullptr) {
      elements = 0;
      for (const ParamSlot& slot : set->layout.slots()) elements += static_cast<size_t>(slot.param->full_numel());
    }
    n += elements * static_cast<size_t>(set->expert_parallel_size());
  }
  return static_cast<int64_t>(n);
}

float Engine::forward(const nn::Batch& batch) {
  Impl& s = *impl_;
  if (model_.forward_pending()) [[unlikely]] {
    throw UsageError("Engine::forward() called twice without a backward() in between: each micro-batch is forward(), "
                     "backward(), step(); to compute a loss without training, use Engine::eval_batch");
  }
  double t0 = now_seconds();
  const uint64_t flops0 = nn::flops_performed(), recomputed0 = nn::flops_recomputed();
  memory::DeviceAccess access(*s.backend_);  // layers, hooks and collectives on device memory
  float loss = 0.0f;
  if (!s.startup_logged_ && s.kernels()) [[unlikely]] s.log_startup_collectives();
  if (s.profiler_ && s.micro_step_ == 0) s.profiler_->window_started(global_step_);
  s.set_position(global_step_, s.micro_step_, batch);
  try {
    for (auto& set : s.sets_) {
      if (set->gatherer) set->gatherer->begin_pass(ParamGatherer::Pass::kForward);
    }
    loss = s.ctx_.forward_loss(model_, s.cast_batch(batch));
    for (auto& set : s.sets_) {
      if (set->gatherer) set->gatherer->end_pass();
    }
  } catch (...) {
    s.abandon_forward(model_);
    throw;
  }
  // Counted once the forward succeeded: a failed forward leaves the window as it was.
  if (s.micro_step_ == 0) {
    s.window_start_s_ = t0;
    s.window_tokens_ = 0;
    s.flops_at_window_start_ = flops0;
    s.recomputed_at_window_start_ = recomputed0;
  }
  if (batch.inputs.dtype() == memory::DType::kI32) s.window_tokens_ += batch.inputs.numel();  // token ids
  s.loss_sum_ += loss;
  s.forward_s_ += now_seconds() - t0;
  return loss;
}

void Engine::backward() {
  Impl& s = *impl_;
  if (!model_.forward_pending()) [[unlikely]] {
    throw UsageError("Engine::backward() without a forward() before it: each micro-batch is forward(batch), then "
                     "backward(), then step()");
  }
  double t0 = now_seconds();
  const int64_t accumulation = config_.batch.gradient_accumulation_steps;
  // Compressed optimizers consume local gradients on the steps they compress (DeepSpeed's
  // enable_backward_allreduce = false).
  const bool reduce = !s.compressed_ || s.exact_gradients(s.steps_taken_ + 1);
  const bool boundary = s.micro_step_ + 1 == accumulation;
  memory::DeviceAccess access(*s.backend_);
  try {
    // The boundary's reductions may still be writing device memory when backward returns.
    if (boundary && !s.reductions_access_) s.reductions_access_.emplace(*s.backend_);
    for (auto& set : s.sets_) {
      // The window's first backward finds the gradient shard zeroed (by the step or a failed window).
      set->reducer->begin_backward(boundary, reduce, /*shard_zero=*/s.micro_step_ == 0);
      // NVMe optimizer states do not depend on the gradients: their first sub-groups are read while
      // the last backward of the step runs.
      if (boundary) set->prefetch_states();
      if (set->gatherer) set->gatherer->begin_pass(ParamGatherer::Pass::kBackward);
    }
    const float grad_scale = static_cast<float>(s.scaler_.scale() / static_cast<double>(accumulation));
    s.ctx_.backward_loss(model_, grad_scale);
    for (auto& set : s.sets_) {
      if (set->gatherer) set->gatherer->end_pass();
    }
    for (auto& set : s.sets_) set->reducer->end_backward();
  } catch (...) {
    s.abandon_window(model_);
    throw;
  }
  ++s.micro_step_;
  s.backward_since_step_ = true;
  s.backward_s_ += now_seconds() - t0;
}

void Engine::Impl::abandon_forward(nn::Model& model) {
  // Cleanup must not hide the error being thrown: a second failure here is dropped.
  try {
    model.clear_saved();
    for (auto& set : sets_) {
      if (set->gatherer) set->gatherer->invalidate();  // gathered or in flight: released; a partial first order is re-recorded
    }
    if (profiler_) profiler_->abandon_pass();
  } catch (...) {
  }
}

void Engine::Impl::abandon_window(nn::Model& model) {
  try {
    model.clear_saved();
    for (auto& set : sets_) {
      set->reducer->abort();
      if (set->gatherer) set->gatherer->invalidate();
    }
    if (profiler_) profiler_->abandon_pass();
    reductions_access_.reset();
    for (auto& set : sets_) {
      set->zero_grads();
      set->zero_fp32_grads();
    }
  } catch (...) {
  }
  micro_step_ = 0;
  loss_sum_ = 0.0;
  forward_s_ = backward_s_ = 0.0;
  backward_since_step_ = false;
}

void Engine::Impl::fill_micro_batch(BatchSource& source, nn::Batch& batch, int64_t step, int64_t m) {
  const int64_t micro = cfg_.batch.micro_batch_per_rank;
  const int64_t first = first_sample(m, micro);
  source.fill(batch, step, first, micro);
  // The engine's global batch arithmetic (and the loss average) rests on every rank filling exactly
  // the samples it was given: a source that fills more or fewer would train on a different batch
  // than the config says, silently.
  auto rows = [](const memory::Tensor& t) { return t.defined() && t.dim() > 0 ? t.size(0) : int64_t{0}; };
  const bool inputs_ok = rows(batch.inputs) == micro;
  const bool targets_ok = !batch.targets.defined() || rows(batch.targets) == micro;
  if (!inputs_ok || !targets_ok) [[unlikely]] {
    throw UsageError(fmt::format(
        "BatchSource::fill(batch, step {}, first_sample {}, count {}) filled batch.inputs with {} rows and "
        "batch.targets with {}: fill exactly `count` samples (dim 0 of inputs and targets), those with global "
        "indices [first_sample, first_sample + count) of the step",
        step, first, micro, rows(batch.inputs), batch.targets.defined() ? std::to_string(rows(batch.targets)) : "none"));
  }
}

void Engine::Impl::set_position(int64_t step, int64_t m, const nn::Batch& batch) {
  const int64_t rows = batch.inputs.defined() && batch.inputs.dim() > 0 ? batch.inputs.size(0) : 0;
  ctx_.set_batch_position({.step = step, .first_sample = first_sample(m, rows), .samples = rows});
}

StepReport Engine::train_batch(BatchSource& source) {
  Impl& s = *impl_;
  if (s.micro_step_ != 0 || model_.forward_pending()) [[unlikely]] {
    throw UsageError(fmt::format(
        "Engine::train_batch called in the middle of an accumulation window ({} of {} micro-batches already run "
        "through forward()/backward(){}): finish the window with forward()/backward()/step() first, or use only "
        "train_batch",
        s.micro_step_, config_.batch.gradient_accumulation_steps,
        model_.forward_pending() ? ", and a forward() without its backward()" : ""));
  }
  nn::Batch batch;
  for (int64_t m = 0; s.pipeline_ == nullptr && m < config_.batch.gradient_accumulation_steps; ++m) {
    s.fill_micro_batch(source, batch, global_step_, m);
    forward(batch);
    backward();
  }
  if (s.pipeline_ != nullptr) s.run_pipeline_window(model_, source, global_step_);  // the schedule's window
  bool stepped = step();
  ZS_ASSERT(stepped, "train_batch ended between accumulation boundaries");
  return last_;
}

double Engine::eval_batch(BatchSource& source, int64_t index) {
  Impl& s = *impl_;
  if (model_.forward_pending()) [[unlikely]] {
    throw UsageError("Engine::eval_batch called between a forward() and its backward(): evaluate before the forward "
                     "or after the backward");
  }
  // Evaluation mode for the duration of the call: modules save nothing, so activations are freed as
  // soon as the next module has read them, and no backward can follow.
  struct TrainingAgain {
    EngineContext& ctx;
    ~TrainingAgain() { ctx.set_training(true); }
  } restore{s.ctx_};
  s.ctx_.set_training(false);
  memory::DeviceAccess access(*s.backend_);
  nn::Batch batch;
  double sum = 0.0;
  for (int64_t m = 0; m < config_.batch.gradient_accumulation_steps; ++m) {
    s.fill_micro_batch(source, batch, index, m);
    s.set_position(index, m, batch);
    try {
      // ZeRO-3 gathers along the recorded forward order and releases after each module, as in training.
      for (auto& set : s.sets_) {
        if (set->gatherer) set->gatherer->begin_pass(ParamGatherer::Pass::kForward);
      }
      sum += s.ctx_.forward_loss(model_, s.cast_batch(batch));
      for (auto& set : s.sets_) {
        if (set->gatherer) set->gatherer->end_pass();
      }
    } catch (...) {
      s.abandon_forward(model_);
      throw;
    }
  }
  // Summed in fp32 as step() agrees on the training loss, so both average the same way.
  float total = static_cast<float>(sum);
  if (group_.size() > 1) group_.allreduce(memory::Tensor::of(std::span<float>(&total, 1)));
  return total / static_cast<double>(config_.batch.gradient_accumulation_steps * group_.size());
}

std::vector<float> Engine::fp32_param(const std::string& name) const {
  auto it = impl_->slot_by_name_.find(name);
  const comm::Group* pp = pipeline_parallel();
  if (pp != nullptr && pp->size() > 1 && pp->is_mpi()) return pipeline_fp32_param(name, it != impl_->slot_by_name_.end());
  if (it == impl_->slot_by_name_.end()) {
    throw UsageError(fmt::format("Engine::fp32_param: no parameter named '{}' on this rank; pass a full name such as "
                                 "'{}' (nn::Parameter::full_name; an expert's parameters are held by its "
                                 "expert-parallel rank only)",
                                 name, impl_->slot_by_name_.empty() ? "" : impl_->slot_by_name_.begin()->first));
  }
  const ModelStates& set = *impl_->sets_[it->second.first];
  const ParamSlot& slot = set.layout.slots()[it->second.second];
  return impl_->gather_full(*slot.param, impl_->gather_fp32(set, slot));
}

std::vector<const comm::Group*> Engine::expert_data_parallel() const {
  std::vector<const comm::Group*> out;
  for (const auto& g : impl_->expert_groups_) out.push_back(g.get());
  return out;
}

}  // namespace zs::engine
