// ModelStates (engine/detail/model_states.h): placement, initialisation, and the master, gradients
// and named buffers on every tier and in every encoding (Note [State owner]). The step is in
// model_states_step.cpp, NVMe swap files in model_states_nvme.cpp.
#include "engine/detail/model_states.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "engine/offload_rules.h"

namespace zs::engine {

StateEnv::StateEnv(const EngineConfig& cfg, memory::Backend& backend, memory::DeviceAllocator& device,
                   memory::MemoryTracker& tracker, const optim::Optimizer* optimizer, int rank, int threads,
                   const comm::Group* tp)
    : cfg(cfg),
      backend(backend),
      device(device),
      tracker(tracker),
      optimizer(optimizer),
      rank(rank),
      tp(tp),
      dtype(cfg.compute_dtype()),
      elem(memory::dtype_size(dtype)),
      scratch(kChunkElements) {
  if (optimizer) specs = optimizer->state_specs();
  const bool reuse = cfg.memory.reuse_fp32_param && cfg.precision == Precision::kBf16;
  grad_scratch.assign(static_cast<size_t>(threads), std::vector<float>(kPieceElements));
  if (reuse) master_scratch.assign(static_cast<size_t>(threads), std::vector<float>(kPieceElements));
  if (cfg.zero.offload_optimizer.device != OffloadDevice::kNone) {
    low_scratch.assign(static_cast<size_t>(threads), std::vector<std::byte>(kPieceElements * elem));
  }
}

StateBuffer ModelStates::allocate(size_t bytes, memory::Category category, bool host) const {
  StateBuffer b;
  if (host) {
    const bool pin = category == memory::Category::kParams ? cfg().zero.offload_param.pin_memory
                                                           : cfg().zero.offload_optimizer.pin_memory;
    // A measuring run maps host buffers without touching them; pinning would commit them.
    b.host = offload::AlignedBuffer(bytes, &env_->tracker, category, pin && env_->kernels());
  } else {
    b.device = env_->device.allocate(bytes, category, memory::Lifetime::kPersistent);
  }
  return b;
}

void ModelStates::place(StateEnv& env, CompressedBuffers* compressed) {
  env_ = &env;
  // The plan's buffers (Note [model-state placement] in engine/placement.h), in its order: swap-file
  // regions are made by init_nvme, the error feedback by comm's compressed allreduce.
  for (const PlannedBuffer& b : plan.buffers) {
    if (b.where == Where::kNvme || b.owned_by_comm) continue;
    StateBuffer buf = allocate(b.bytes, b.category, b.where == Where::kHost);
    // Gradients and optimizer states start at zero; parameters and masters are initialised below.
    const bool written_first = b.role == BufferRole::kParams || b.role == BufferRole::kMaster ||
                               b.role == BufferRole::kResidual || b.role == BufferRole::kFp32Grads;
    if (!written_first) backend().fill_zero(buf.data(), buf.tier(), buf.size());
    switch (b.role) {
      case BufferRole::kParams: params_ = std::move(buf); break;
      case BufferRole::kGrads: grads_ = std::move(buf); break;
      case BufferRole::kFp32Grads: grad32_ = std::move(buf); break;
      case BufferRole::kMaster: master_ = std::move(buf); break;
      case BufferRole::kResidual: residual_ = std::move(buf); break;
      case BufferRole::kOptimizerState: states_.push_back(std::move(buf)); break;  // in state_specs() order
      case BufferRole::kMomentum: compressed->momentum = std::move(buf); break;
      case BufferRole::kVariance: compressed->variance = std::move(buf); break;
      case BufferRole::kAccumulator: compressed->accumulator = std::move(buf); break;
      case BufferRole::kErrorFeedback: ZS_ASSERT(false, "the error feedback is comm's"); break;
    }
  }
  for (size_t k = 0; k < states_.size(); ++k) {
    const optim::StateSpec& spec = env.specs[k];
    if (spec.value_bytes == sizeof(float) && spec.elements_per_value == 1 && spec.initial_value != 0.0f) {
      backend().fill(static_cast<float*>(states_[k].data()), states_[k].tier(), spec.initial_value, step_range().size);
    }
  }
}

void ModelStates::initialise_and_bind(const std::vector<nn::Module*>& modules) {
  bind_parameters();
  if (!env_->kernels()) {
    // Measuring (the estimator): nothing to initialise, and no swap files. NVMe parameters get an
    // untouched stand-in so the gatherer runs its usual path.
    if (params_on_nvme()) {
      measure_param_shard_ = backend().allocate(std::max<size_t>(1, partition.mine.size * env_->elem), memory::Tier::kHost);
    }
  } else if (optimizer_on_nvme() || params_on_nvme()) {
    init_nvme();  // initialises what lives on NVMe, and the rest through initialise()
  } else {
    memory::run_kernel(backend(), [&] { initialise(); });
  }
  make_reducer_and_gatherer(modules);
}

void ModelStates::bind_parameters() {
  for (const ParamSlot& s : layout.slots()) {
    // Stage 3: no parameter has data until the gatherer fetches it. Stage 2+: gradients live in the
    // reducer's staging buffers during backward only.
    s.param->set_data(plan.stage == 3 ? memory::Tensor() : memory::Tensor(param_at(s.offset), env_->dtype, s.param->shape()));
    s.param->set_grad(plan.grad_stage >= 2 ? memory::Tensor() : memory::Tensor(grad_at(s.offset), env_->dtype, s.param->shape()));
  }
}

void ModelStates::make_reducer_and_gatherer(const std::vector<nn::Module*>& modules) {
  const EngineConfig& cfg = this->cfg();
  GradReducer::Options ro{.stage = plan.grad_stage, .overlap_comm = cfg.zero.overlap_comm, .reduce_scatter = cfg.zero.reduce_scatter,
                          .bucket_elements = static_cast<size_t>(cfg.zero.reduce_bucket_size),
                          .grads_tier = grads_.tier(),
                          .comm_dtype = cfg.gradient_comm_dtype()};
  const bool kernels = env_->kernels();
  if (zeropp != nullptr && cfg.zero.zero_quantized_gradients) {
    ro.quantized_host = zeropp->host;
    ro.quantized_across = zeropp->across;
    ro.kernels = kernels;
  }
  reducer.emplace(ro, layout, partition, group, env_->device, env_->dtype, grads_.data(), modules);
  if (plan.stage != 3) return;
  ParamGatherer::Options go{.prefetch_elements = static_cast<size_t>(cfg.zero.stage3_prefetch_bucket_size),
                            .persistence_threshold = static_cast<size_t>(cfg.zero.stage3_param_persistence_threshold),
                            .max_live_elements = static_cast<size_t>(cfg.zero.stage3_max_live_parameters),
                            .max_reuse_distance = static_cast<size_t>(cfg.zero.stage3_max_reuse_distance),
                            .nvme = nullptr,
                            .nvme_region = {},
                            .tracker = nullptr,
                            .shard_tier = params_on_nvme() ? memory::Tier::kHost : params_.tier(),
                            .zeropp = {}};
  if (zeropp != nullptr) {
    go.zeropp = {.host = cfg.zero.zero_hpz_partition_size > 1 ? zeropp->host : nullptr,
                 .quantized = cfg.zero.zero_quantized_weights,
                 .kernels = kernels};
  }
  const void* shard = params_.data();
  if (params_on_nvme()) {
    const auto& op = cfg.zero.offload_param;
    go.prefetch_elements = nvme_prefetch_window(go.prefetch_elements, static_cast<size_t>(op.buffer_count),
                                                static_cast<size_t>(op.buffer_size), static_cast<size_t>(op.max_in_cpu));
    go.tracker = &env_->tracker;
    if (nvme_) {
      go.nvme = nvme_->param_swap.get();
      go.nvme_region = nvme_->params;
    } else {
      shard = measure_param_shard_.data();
    }
  }
  gatherer.emplace(go, layout, partition, group, env_->device, env_->dtype, shard, modules);
}

float* ModelStates::master_at(size_t i) const {
  ZS_DEBUG_ASSERT(!plan.reuse_fp32_param && !optimizer_on_nvme(), "master_at with reuse_fp32_param or NVMe offload");
  if (!plan.separate_master) return reinterpret_cast<float*>(param_at(i));
  return static_cast<float*>(master_.data()) + (i - step_range().offset);
}

void* ModelStates::state_at(size_t k, size_t i) const {
  const optim::StateSpec& spec = env_->specs[k];
  // Stepped ranges and pieces start at multiples of 32 elements (FlatLayout::kAlignElements), so a
  // block-quantised state's value for element i is the one of i's block.
  const size_t rel = i - step_range().offset;
  return static_cast<char*>(states_[k].data()) + rel / spec.elements_per_value * spec.value_bytes;
}

const float* ModelStates::master_view(size_t i, size_t n, int t) const {
  if (!plan.reuse_fp32_param) return master_at(i);
  // Read only: decoded into the thread's scratch, nothing to encode back.
  float* master = env_->master_scratch[static_cast<size_t>(t)].data();
  decode_master(reinterpret_cast<const uint16_t*>(param_at(i)), residual_at(i), master, n);
  return master;
}

void ModelStates::init_f32(float* dst, memory::ShardRange range) const {
  // Straight into place by the counter-based RNG: the same values for any world size and stage (Note
  // in nn/parameter.h), and for any cut into pieces, so the pieces run on the rank's threads.
  // Padding between parameters is zero.
  constexpr size_t kInitPiece = size_t{1} << 20;
  for_each_span(range, kInitPiece, [&](size_t at, size_t n, int) {
    const memory::ShardRange piece{at, n};
    float* out = dst + (at - range.offset);
    std::fill_n(out, n, 0.0f);
    for (const ParamSlot& s : layout.slots()) {
      memory::ShardRange part = s.range().intersect(piece);
      if (part.empty()) continue;
      s.param->init_values({out + (part.offset - piece.offset), part.size}, part.offset - s.offset, cfg().seed);
    }
  });
}

void ModelStates::initialise() {
  const memory::ShardRange stepped = step_range();
  const size_t total = layout.total();
  const bool reuse = plan.reuse_fp32_param;
  std::vector<float>& scratch = env_->scratch;
  // A separate fp32 master in memory (bf16/fp16, or offloaded to the host); NVMe ones are written by
  // init_nvme, which calls this for the rest.
  if (plan.separate_master && !reuse && !optimizer_on_nvme()) init_f32(master_at(stepped.offset), stepped);
  if (params_on_nvme()) return;
  const memory::ShardRange held = plan.stage == 3 ? partition.mine : memory::ShardRange{0, total};
  if (!mixed()) {
    init_f32(reinterpret_cast<float*>(param_at(held.offset)), held);
    return;
  }
  // bf16/fp16 parameters this rank holds, converted chunk by chunk: never the whole model in fp32.
  // With reuse_fp32_param every held parameter is encoded the way its owner's optimizer encodes it,
  // and the stepped range keeps its residuals.
  std::vector<uint16_t> residual(reuse ? kChunkElements : 0);
  for (size_t off = 0; off < held.size; off += kChunkElements) {
    const memory::ShardRange chunk{held.offset + off, std::min(kChunkElements, held.size - off)};
    init_f32(scratch.data(), chunk);
    if (!reuse) {
      memory::convert(scratch.data(), memory::DType::kF32, param_at(chunk.offset), env_->dtype, chunk.size);
      continue;
    }
    encode_master(scratch.data(), reinterpret_cast<uint16_t*>(param_at(chunk.offset)), residual.data(), chunk.size);
    const memory::ShardRange kept = chunk.intersect(stepped);
    if (!kept.empty()) {
      std::memcpy(residual_at(kept.offset), residual.data() + (kept.offset - chunk.offset), kept.size * sizeof(uint16_t));
    }
  }
}

std::span<const float> ModelStates::grad_f32(size_t i, size_t n, int t) const {
  float* out = env_->grad_scratch[static_cast<size_t>(t)].data();
  const bool keep = plan.keep_fp32_grads;
  const bool fp32 = keep || !mixed();
  const StateBuffer& buf = keep ? grad32_ : grads_;
  const void* src = keep ? static_cast<const void*>(f32_at(grad32_.data(), plan.fp32_grads, i)) : grad_at(i);
  if (step_on_host() && buf.tier() == memory::Tier::kDevice) {
    // A host step reads device gradients through the backend: a counted device -> host transfer.
    backend().convert(out, memory::Tier::kHost, memory::DType::kF32, src, memory::Tier::kDevice,
                      fp32 ? memory::DType::kF32 : env_->dtype, n);
    return {out, n};
  }
  if (fp32) return {static_cast<const float*>(src), n};
  memory::convert(src, env_->dtype, out, memory::DType::kF32, n);
  return {out, n};
}

void ModelStates::fill_fp32_grads() {
  if (!plan.keep_fp32_grads) return;
  // release_fp32_grad off: one conversion pass into the persistent fp32 copy, before the norm.
  const memory::ShardRange range = plan.fp32_grads;
  backend().convert(f32_at(grad32_.data(), range, range.offset), grad32_.tier(), memory::DType::kF32, grad_at(range.offset),
                    grads_.tier(), env_->dtype, range.size);
}

void ModelStates::zero_grads() { backend().fill_zero(grads_.data(), grads_.tier(), grads_.size()); }

void ModelStates::zero_fp32_grads() {
  if (!grad32_.empty()) backend().fill_zero(grad32_.data(), grad32_.tier(), grad32_.size());
}

void ModelStates::read_master(memory::ShardRange range, float* dst) const {
  if (range.empty()) return;
  if (optimizer_on_nvme()) {
    nvme_io(*nvme_->optimizer_swap, nvme_->master, (range.offset - step_range().offset) * sizeof(float), dst,
            range.size * sizeof(float), false);
    return;
  }
  if (!plan.reuse_fp32_param) {
    const memory::Tier tier = plan.separate_master ? master_.tier() : params_.tier();
    backend().copy(dst, memory::Tier::kHost, master_at(range.offset), tier, range.size * sizeof(float));
    return;
  }
  // Both halves of the encoded master cross to the host, and are decoded there.
  std::vector<uint16_t> hi(range.size), lo(range.size);
  backend().copy(hi.data(), memory::Tier::kHost, param_at(range.offset), memory::Tier::kDevice, range.size * sizeof(uint16_t));
  backend().copy(lo.data(), memory::Tier::kHost, residual_at(range.offset), memory::Tier::kDevice, range.size * sizeof(uint16_t));
  decode_master(hi.data(), lo.data(), dst, range.size);
}

void ModelStates::write_master(memory::ShardRange range, const float* src) {
  const memory::ShardRange stepped = step_range();
  const size_t elem = env_->elem;
  if (optimizer_on_nvme()) {
    nvme_io(*nvme_->optimizer_swap, nvme_->master, (range.offset - stepped.offset) * sizeof(float), const_cast<float*>(src),
            range.size * sizeof(float), true);
  } else if (plan.reuse_fp32_param) {
    // The master is the bf16 parameter (its upper half, rounded) plus a 16-bit residual.
    std::vector<uint16_t> hi(range.size), lo(range.size);
    encode_master(src, hi.data(), lo.data(), range.size);
    write_bytes(params_, (range.offset - plan.params.offset) * elem, hi.data(), range.size * sizeof(uint16_t));
    write_bytes(residual_, (range.offset - stepped.offset) * sizeof(uint16_t), lo.data(), range.size * sizeof(uint16_t));
    return;
  } else {
    backend().copy(master_at(range.offset), plan.separate_master ? master_.tier() : params_.tier(), src, memory::Tier::kHost,
                   range.size * sizeof(float));
    if (!plan.separate_master) return;  // fp32 in memory: the master is the parameters
  }
  // The parameters in the training dtype: the master rounded, as every step writes them.
  std::vector<std::byte> low(range.size * elem);
  memory::convert(src, memory::DType::kF32, low.data(), env_->dtype, range.size);
  if (params_on_nvme()) {
    nvme_io(*nvme_->param_swap, nvme_->params, (range.offset - stepped.offset) * elem, low.data(), low.size(), true);
  } else {
    write_bytes(params_, (range.offset - plan.params.offset) * elem, low.data(), low.size());
  }
}

void ModelStates::read_params(memory::ShardRange range, void* dst) const {
  const size_t elem = env_->elem;
  if (params_on_nvme()) {
    nvme_io(*nvme_->param_swap, nvme_->params, (range.offset - step_range().offset) * elem, dst, range.size * elem, false);
  } else {
    read_bytes(params_, (range.offset - plan.params.offset) * elem, dst, range.size * elem);
  }
}

void ModelStates::read_state(size_t k, size_t offset, void* dst, size_t bytes) const {
  if (nvme_ && optimizer_on_nvme()) {
    nvme_io(*nvme_->optimizer_swap, nvme_->states[k], offset, dst, bytes, false);
    return;
  }
  read_bytes(states_[k], offset, dst, bytes);
}

void ModelStates::write_state(size_t k, size_t offset, const void* src, size_t bytes) {
  if (nvme_ && optimizer_on_nvme()) {
    nvme_io(*nvme_->optimizer_swap, nvme_->states[k], offset, const_cast<void*>(src), bytes, true);
    return;
  }
  write_bytes(states_[k], offset, src, bytes);
}

void ModelStates::read_bytes(const StateBuffer& b, size_t offset, void* dst, size_t bytes) const {
  backend().copy(dst, memory::Tier::kHost, static_cast<const char*>(b.data()) + offset, b.tier(), bytes);
}

void ModelStates::write_bytes(const StateBuffer& b, size_t offset, const void* src, size_t bytes) const {
  backend().copy(static_cast<char*>(b.data()) + offset, b.tier(), src, memory::Tier::kHost, bytes);
}

void ModelStates::allgather_params() {
  // Stages 1-2: every rank updated its shard of the whole parameter buffer; gather the rest in
  // allgather_bucket_size pieces, in place, over the set's group.
  if (group.size() == 1) return;
  memory::DeviceAccess access(backend());  // the collectives read and write device memory
  allgather_in_place(group, partition, memory::Tensor(params_.data(), env_->dtype, {static_cast<int64_t>(layout.total())}),
                     static_cast<size_t>(cfg().zero.allgather_bucket_size));
}

void allgather_in_place(const comm::Group& group, const Partition& partition, const memory::Tensor& all,
                        size_t bucket_elements) {
  const size_t total = static_cast<size_t>(all.numel());
  const size_t bucket = std::max<size_t>(FlatLayout::kAlignElements, bucket_elements);
  std::vector<comm::Work> works;
  for (size_t off = 0; off < total; off += bucket) {
    const memory::ShardRange piece{off, std::min(bucket, total - off)};
    works.push_back(group.allgatherv_async(all.range(partition.owned(piece)), all.range(piece), partition.counts(piece)));
  }
  for (auto& w : works) w.wait();
}

void ModelStates::add_state_bytes(ModelStateBytes& b) const {
  b.params += params_.size();
  b.grads += grads_.size() + grad32_.size();
  b.optimizer += master_.size() + residual_.size();
  for (const auto& st : states_) b.optimizer += st.size();
}

void ModelStates::add_tier_bytes(Engine::MemoryReport& r) const {
  auto by_tier = [&r](const StateBuffer& b, uint64_t ModelStateBytes::*category) {
    r.device_states.*category += b.device.size();
    r.host_states.*category += b.host.capacity();
  };
  by_tier(params_, &ModelStateBytes::params);
  by_tier(grads_, &ModelStateBytes::grads);
  by_tier(grad32_, &ModelStateBytes::grads);
  by_tier(master_, &ModelStateBytes::optimizer);
  for (const auto& state : states_) by_tier(state, &ModelStateBytes::optimizer);
  r.device_states.optimizer += residual_.size();
  if (nvme_) {
    r.nvme_states.params += nvme_->params.reserved_bytes();
    r.nvme_states.optimizer += nvme_->master.reserved_bytes();
    for (const auto& region : nvme_->states) r.nvme_states.optimizer += region.reserved_bytes();
  }
}

uint64_t ModelStates::optimizer_state_bytes() const {
  uint64_t bytes = 0;
  for (const auto& st : states_) bytes += st.size();
  return bytes;
}

}  // namespace zs::engine
