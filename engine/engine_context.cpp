#include "engine/detail/engine_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "core/errors.h"
#include "engine/detail/engine_impl.h"

namespace zs::engine {

memory::Tensor EngineContext::allocate(memory::Shape shape, memory::DType dtype, nn::MemoryUse use) {
  // Saved activations are freed in about the reverse order of allocation and go beside the model
  // states; scratch and gradients are short-lived (Note [Saved blocks] in memory/alloc_policy.h).
  const memory::Lifetime lifetime = use == nn::MemoryUse::kActivation ? memory::Lifetime::kSaved : memory::Lifetime::kTransient;
  size_t bytes = static_cast<size_t>(memory::shape_numel(shape)) * memory::dtype_size(dtype);
  // The block returns to the arena when the last view of the tensor is dropped (nn's memory contract),
  // and the arena stays while a block of it does (Note [engine memory lifetime]).
  struct ArenaBlock {
    std::shared_ptr<DeviceArena> arena;  // declared first: released after the block
    memory::DeviceBlock block;
  };
  auto owner = std::make_shared<ArenaBlock>(ArenaBlock{
      arena_, device_.allocate(std::max<size_t>(bytes, 1), memory::Category::kActivations, lifetime)});
  memory::Tensor view = owner->block.tensor(dtype, std::move(shape));
  return memory::Tensor(view.raw(), dtype, view.shape(), view.strides(), std::move(owner));
}

nn::Batch Engine::Impl::cast_batch(const nn::Batch& batch) {
  if (!cfg_.auto_cast) return batch;
  const memory::DType to = cfg_.compute_dtype();
  auto cast = [&](const memory::Tensor& t) {
    if (!t.defined() || t.dtype() == memory::DType::kI32 || t.dtype() == to) return t;
    if (!t.is_contiguous()) [[unlikely]] {
      throw UsageError(fmt::format("fp16.auto_cast: the batch's floating-point tensors must be contiguous to be cast "
                                   "to {}, got a strided {} tensor; fill the batch with contiguous tensors",
                                   memory::dtype_name(to), memory::shape_string(t.shape())));
    }
    memory::Tensor out = ctx_.allocate(t.shape(), to, nn::MemoryUse::kActivation);
    backend_->convert(out.raw(), memory::Tier::kDevice, to, t.raw(), memory::Tier::kDevice, t.dtype(),
                      static_cast<size_t>(t.numel()));
    return out;
  };
  return nn::Batch{cast(batch.inputs), cast(batch.targets)};
}

}  // namespace zs::engine
