#include "engine/detail/engine_context.h"

#include <algorithm>
#include <memory>

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

}  // namespace zs::engine
