#include "memory/tensor.h"

#include <cstdlib>
#include <cstring>
#include <numeric>

namespace zs::memory {
namespace {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

}  // namespace

int64_t shape_numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string shape_string(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

Tensor::Tensor(void* data, DType dtype, Shape shape)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(contiguous_strides(shape_)) {}

Tensor::Tensor(void* data, DType dtype, Shape shape, Shape strides, std::shared_ptr<void> owner)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)), owner_(std::move(owner)) {
  ZS_ASSERT(shape_.size() == strides_.size(), "shape {} with {} strides", shape_string(shape_), strides_.size());
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (int64_t d : shape) ZS_ASSERT(d >= 0, "negative dimension in {}", shape_string(shape));
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw OutOfMemoryError(fmt::format("host allocation of {} bytes for a tensor {} failed", bytes, shape_string(shape)));
  std::memset(p, 0, rounded);
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  Shape strides = contiguous_strides(shape);
  return Tensor(p, dtype, std::move(shape), std::move(strides), std::move(owner));
}

Tensor Tensor::of(std::span<float> values, Shape shape) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  ZS_ASSERT(shape_numel(shape) == static_cast<int64_t>(values.size()), "shape {} for {} values", shape_string(shape), values.size());
  return Tensor(values.data(), DType::kF32, std::move(shape));
}

bool Tensor::is_contiguous() const {  // strides_ == contiguous_strides(shape_), without allocating
  if (strides_.size() != shape_.size()) return false;
  int64_t s = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

std::span<float> Tensor::f32() const {
  ZS_ASSERT(dtype_ == DType::kF32 && is_contiguous(), "f32() on a {} tensor {}", dtype_name(dtype_), shape_string(shape_));
  return {static_cast<float*>(data_), static_cast<size_t>(numel())};
}

std::span<uint16_t> Tensor::u16() const {
  ZS_ASSERT(dtype_ != DType::kF32 && is_contiguous(), "u16() on a {} tensor {}", dtype_name(dtype_), shape_string(shape_));
  return {static_cast<uint16_t*>(data_), static_cast<size_t>(numel())};
}

Tensor Tensor::view(Shape shape) const {
  ZS_ASSERT(is_contiguous(), "view of a non-contiguous tensor {}", shape_string(shape_));
  ZS_ASSERT(shape_numel(shape) == numel(), "view {} of a tensor {}", shape_string(shape), shape_string(shape_));
  Shape strides = contiguous_strides(shape);
  return Tensor(data_, dtype_, std::move(shape), std::move(strides), owner_);
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  if (d < 0) d += dim();
  ZS_ASSERT(d >= 0 && d < dim(), "slice dimension {} of a {}-D tensor", d, dim());
  ZS_ASSERT(0 <= begin && begin <= end && end <= shape_[static_cast<size_t>(d)], "slice [{}, {}) of dimension {} in {}",
            begin, end, d, shape_string(shape_));
  Shape shape = shape_;
  shape[static_cast<size_t>(d)] = end - begin;
  auto* base = static_cast<char*>(data_) + begin * strides_[static_cast<size_t>(d)] * static_cast<int64_t>(dtype_size(dtype_));
  return Tensor(base, dtype_, std::move(shape), strides_, owner_);
}

Tensor Tensor::range(ShardRange r) const {
  ZS_ASSERT(dim() == 1 && is_contiguous(), "range() needs a contiguous 1-D tensor, got {}", shape_string(shape_));
  ZS_ASSERT(r.end() <= static_cast<size_t>(numel()), "range [{}, {}) of {} elements", r.offset, r.end(), numel());
  auto* base = static_cast<char*>(data_) + r.offset * dtype_size(dtype_);
  return Tensor(base, dtype_, {static_cast<int64_t>(r.size)}, {1}, owner_);
}

void Tensor::zero() const {
  ZS_ASSERT(is_contiguous(), "zero() of a non-contiguous tensor");
  if (nbytes() > 0) std::memset(data_, 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) const {
  ZS_ASSERT(is_contiguous() && src.is_contiguous(), "copy_from needs contiguous tensors");
  ZS_ASSERT(numel() == src.numel(), "copy_from {} into {}", shape_string(src.shape_), shape_string(shape_));
  convert(src.data_, src.dtype_, data_, dtype_, static_cast<size_t>(numel()));
}

}  // namespace zs::memory
