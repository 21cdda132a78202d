// Activation recomputation in the engine (DeepSpeed calls it activation checkpointing, and the config
// section keeps DeepSpeed's name, `activation_checkpointing`): the section applied to the model and
// to the engine's Context (RecomputeInputStore), and what it reports.
#include <algorithm>

#include "core/errors.h"
#include "engine/detail/recompute_store.h"
#include "engine/detail/engine_impl.h"
#include "nn/gpt.h"
#include "offload/aligned_buffer.h"

namespace zs::engine {

// ---- RecomputeInputStore -----------------------------------------------------------------------

// The contiguous buffer and its slots' use. Shared by the store and every kept copy in a slot, so a
// copy outliving the store still frees into live memory (Note [engine memory lifetime]).
struct RecomputeInputStore::Slots {
  std::shared_ptr<DeviceArena> arena;  // declared first: released after the block
  memory::DeviceBlock device;
  offload::AlignedBuffer host;
  size_t slot_bytes = 0;
  std::vector<bool> used;
  char* base() const { return device.empty() ? reinterpret_cast<char*>(host.data()) : static_cast<char*>(device.data()); }
};

RecomputeInputStore::RecomputeInputStore(const RecomputeConfig& cfg, int64_t slots,
                                           std::shared_ptr<DeviceArena> arena)
    : cfg_(cfg), slot_count_(slots), arena_(std::move(arena)) {}

RecomputeInputStore::~RecomputeInputStore() = default;

size_t RecomputeInputStore::buffer_bytes() const {
  return slots_ ? slots_->slot_bytes * slots_->used.size() : 0;
}

memory::Tensor RecomputeInputStore::keep(const memory::Tensor& input) {
  memory::Backend& backend = *arena_->backend;
  if (cfg_.synchronize_checkpoint_boundary) backend.synchronize();
  if (cfg_.contiguous_memory_optimization) return keep_in_slot(input);
  if (!cfg_.cpu_checkpointing) return input;
  const size_t bytes = input.nbytes();
  // The copy's owner keeps the arena, whose tracker counts its bytes (Note [engine memory lifetime]).
  struct HostCopy {
    std::shared_ptr<DeviceArena> arena;
    offload::AlignedBuffer buffer;
  };
  auto host = std::make_shared<HostCopy>(HostCopy{
      arena_, offload::AlignedBuffer(std::max<size_t>(bytes, 1), &arena_->tracker, memory::Category::kActivations)});
  std::byte* data = host->buffer.data();
  backend.copy(data, memory::Tier::kHost, input.raw(), memory::Tier::kDevice, bytes);
  return memory::Tensor(data, input.dtype(), input.shape(), input.strides(), std::move(host));
}

memory::Tensor RecomputeInputStore::keep_in_slot(const memory::Tensor& input) {
  const size_t bytes = input.nbytes();
  const memory::Tier tier = cfg_.cpu_checkpointing ? memory::Tier::kHost : memory::Tier::kDevice;
  if (!slots_) {
    // Sized by the first kept input: a model's checkpointed blocks keep inputs of one shape.
    auto s = std::make_shared<Slots>();
    s->arena = arena_;
    s->slot_bytes = memory::align_up(std::max<size_t>(bytes, 1));
    s->used.assign(static_cast<size_t>(slot_count_), false);
    const size_t total = s->slot_bytes * static_cast<size_t>(slot_count_);
    if (cfg_.cpu_checkpointing) {
      s->host = offload::AlignedBuffer(total, &arena_->tracker, memory::Category::kActivations);
    } else {
      s->device = arena_->allocator.allocate(total, memory::Category::kActivations, memory::Lifetime::kPersistent);
    }
    slots_ = std::move(s);
  }
  if (bytes > slots_->slot_bytes) {
    throw ConfigError(fmt::format("activation_checkpointing.contiguous_memory_optimization: a checkpointed module's input "
                                  "of {} bytes does not fit the buffer's slots of {} bytes (sized by the first kept "
                                  "input): it needs checkpointed modules whose inputs have one size; set it to false",
                                  bytes, slots_->slot_bytes));
  }
  auto free_slot = std::find(slots_->used.begin(), slots_->used.end(), false);
  if (free_slot == slots_->used.end()) {
    throw ConfigError(fmt::format("activation_checkpointing.number_checkpoints: all {} slots of the contiguous buffer hold "
                                  "kept inputs and another checkpointed module needs one; set it to the number of "
                                  "checkpointed modules (or leave it out: that is the default)",
                                  slots_->used.size()));
  }
  const size_t index = static_cast<size_t>(free_slot - slots_->used.begin());
  slots_->used[index] = true;
  char* at = slots_->base() + index * slots_->slot_bytes;
  arena_->backend->copy(at, tier, input.raw(), memory::Tier::kDevice, bytes);
  // The slot frees when the last view of the copy goes (after the module's backward, with restore).
  std::shared_ptr<void> owner(nullptr, [slots = slots_, index](void*) { slots->used[index] = false; });
  return memory::Tensor(at, input.dtype(), input.shape(), input.strides(), std::move(owner));
}

memory::Tensor RecomputeInputStore::restore(memory::Tensor kept, memory::Tensor fresh) {
  memory::Backend& backend = *arena_->backend;
  if (on_host()) {
    backend.copy(fresh.raw(), memory::Tier::kDevice, kept.raw(), memory::Tier::kHost, kept.nbytes());
    kept = std::move(fresh);
  }
  if (cfg_.synchronize_checkpoint_boundary) backend.synchronize();
  return kept;
}

// ---- EngineContext ------------------------------------------------------------------------------

memory::Tensor EngineContext::keep_recompute_input(const memory::Tensor& input) {
  return checkpoints_ ? checkpoints_->keep(input) : input;
}

memory::Tensor EngineContext::restore_recompute_input(memory::Tensor kept) {
  if (!checkpoints_) return kept;
  memory::Tensor fresh;
  if (checkpoints_->on_host()) fresh = allocate(kept.shape(), kept.dtype(), nn::MemoryUse::kActivation);
  return checkpoints_->restore(std::move(kept), std::move(fresh));
}

// ---- Engine -------------------------------------------------------------------------------------

void Engine::Impl::setup_recompute(nn::Model& model) {
  const RecomputeConfig& ac = cfg_.recompute;
  if (ac.budget()) {
    throw ConfigError("activation_checkpointing.device_budget_mb: the budget is turned into a choice of blocks before "
                      "the engine is built (engine::resolve_recompute_budget in estimate/recompute_budget.h; `zeroshard "
                      "train` and `zeroshard estimate` do it); a program building its own engine resolves it first, or "
                      "names checkpoint_blocks");
  }
  if (ac.blocks != RecomputeConfig::Blocks::kNone && !ac.applied_by_program) {
    auto* gpt = dynamic_cast<nn::GptModel*>(&model);
    if (gpt == nullptr) {
      throw ConfigError(fmt::format(
          "activation_checkpointing.checkpoint_blocks: \"{}\" chooses blocks of the built-in GPT (a `model` section "
          "without moe), and this model is a {}: mark your own model's modules with nn::Module::set_recomputed(true) "
          "instead, and remove checkpoint_blocks",
          checkpoint_blocks_name(ac), model.type_name()));
    }
    gpt->set_recompute(gpt_recompute(ac, gpt->config().n_layer));
  }
  int64_t marked = 0;
  for (nn::Module* m : model.named_modules()) marked += m->recomputed() ? 1 : 0;
  checkpointed_modules_ = marked;
  if (marked > 0 && (ac.cpu_checkpointing || ac.contiguous_memory_optimization || ac.synchronize_checkpoint_boundary)) {
    ctx_.set_checkpoint_store(std::make_unique<RecomputeInputStore>(
        ac, ac.number_checkpoints > 0 ? ac.number_checkpoints : marked, arena_));
  }
}

Engine::RecomputeReport Engine::recompute_report() const {
  const Impl& s = *impl_;
  RecomputeReport r;
  r.blocks = checkpoint_blocks_name(config_.recompute);
  r.checkpointed_modules = s.checkpointed_modules_;
  r.recomputes = s.ctx_.recompute_stats().modules;
  r.recompute_s = s.ctx_.recompute_stats().seconds;
  r.contiguous_buffer_bytes = s.ctx_.checkpoint_buffer_bytes();
  return r;
}

}  // namespace zs::engine
