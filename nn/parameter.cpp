#include "nn/parameter.h"

#include <algorithm>

#include "core/errors.h"
#include "core/rng.h"

namespace zs::nn {

void Init::fill(std::span<float> out, uint64_t first_index, uint64_t seed, const std::string& full_name) const {
  switch (kind_) {
    case Kind::kZeros:
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    case Kind::kOnes:
      std::fill(out.begin(), out.end(), 1.0f);
      return;
    case Kind::kNormal: {
      CounterRng rng(seed, full_name);
      rng.fill_normal(out, first_index, a_, b_);
      return;
    }
    case Kind::kUniform: {
      CounterRng rng(seed, full_name);
      rng.fill_uniform(out, first_index, a_, b_);
      return;
    }
  }
  ZS_ASSERT(false, "unknown Init kind {}", static_cast<int>(kind_));
}

std::string Init::describe() const {
  switch (kind_) {
    case Kind::kZeros: return "zeros";
    case Kind::kOnes: return "ones";
    case Kind::kNormal: return fmt::format("normal({}, {})", a_, b_);
    case Kind::kUniform: return fmt::format("uniform({}, {})", a_, b_);
  }
  return "unknown";
}

Parameter::Parameter(std::string name, memory::Shape shape, Init init, std::vector<std::string> tags)
    : name_(std::move(name)), full_name_(name_), shape_(std::move(shape)), init_(init), tags_(std::move(tags)) {
  // A user's module declares these: a wrong one is the model's mistake, not a zeroshard bug.
  if (name_.empty() || name_.find('.') != std::string::npos) {
    throw ModelError(fmt::format("parameter name '{}': must be non-empty and without '.' (the dot separates the module "
                                 "path in full names); rename it",
                                 name_));
  }
  for (int64_t d : shape_) {
    if (d <= 0) {
      throw ModelError(fmt::format("parameter '{}' declared with shape {}: every dimension must be >= 1", name_,
                                   memory::shape_string(shape_)));
    }
  }
}

bool Parameter::has_tag(std::string_view tag) const {
  return std::find(tags_.begin(), tags_.end(), tag) != tags_.end();
}

void Parameter::add_tag(std::string_view tag) {
  if (!has_tag(tag)) tags_.emplace_back(tag);
}

void Parameter::set_data(memory::Tensor t) {
  ZS_ASSERT(!t.defined() || t.raw() == nullptr || t.shape() == shape_, "data {} for parameter '{}' of shape {}",
            memory::shape_string(t.shape()), full_name_, memory::shape_string(shape_));
  ZS_ASSERT(t.raw() == nullptr || t.dtype() != memory::DType::kI32, "integer data for parameter '{}'", full_name_);
  data_ = std::move(t);
}

void Parameter::set_grad(memory::Tensor t) {
  ZS_ASSERT(t.raw() == nullptr || t.shape() == shape_, "grad {} for parameter '{}' of shape {}",
            memory::shape_string(t.shape()), full_name_, memory::shape_string(shape_));
  ZS_ASSERT(t.raw() == nullptr || t.dtype() != memory::DType::kI32, "integer grad for parameter '{}'", full_name_);
  grad_ = std::move(t);
}

void Parameter::set_expert_parallel_size(int e) {
  if (e < 1) throw ConfigError(fmt::format("parameter '{}': expert_parallel_size must be >= 1, got {}", full_name_, e));
  expert_parallel_size_ = e;
}

void Parameter::set_tensor_slice(const TensorSlice& slice) {
  const auto rank = static_cast<int>(shape_.size());
  const bool fits = slice.dim >= 0 && slice.dim < rank && slice.parts >= 1 && slice.index >= 0 &&
                    slice.index < slice.parts && slice.stride >= 1 && shape_[slice.dim] % slice.stride == 0;
  if (!fits) {
    throw ModelError(fmt::format("parameter '{}' of shape {}: tensor slice dim {} parts {} index {} stride {} does "
                                 "not fit (0 <= dim < rank, 0 <= index < parts, stride divides the dimension; "
                                 "Note [tensor slices] in nn/parameter.h)",
                                 full_name_, memory::shape_string(shape_), slice.dim, slice.parts, slice.index,
                                 slice.stride));
  }
  const int64_t padded = shape_[slice.dim] * slice.parts;
  if (slice.full_extent != 0 && (slice.stride != 1 || slice.full_extent < 0 || slice.full_extent > padded)) {
    throw ModelError(fmt::format("parameter '{}' of shape {}: a padded tensor slice needs stride 1 and a full extent "
                                 "in [1, {}] along dim {}, got stride {} and full extent {} (Note [tensor slices] in "
                                 "nn/parameter.h)",
                                 full_name_, memory::shape_string(shape_), padded, slice.dim, slice.stride,
                                 slice.full_extent));
  }
  slice_ = slice;
  inner_ = 1;
  for (int d = slice.dim + 1; d < rank; ++d) inner_ *= static_cast<uint64_t>(shape_[d]);
  local_block_ = static_cast<uint64_t>(shape_[slice.dim] / slice.stride);
  full_dim_ = static_cast<uint64_t>(slice.full_extent != 0 ? slice.full_extent : padded);
  const int64_t first_row = shape_[slice.dim] * slice.index;
  valid_rows_ = static_cast<uint64_t>(
      slice.full_extent != 0 ? std::clamp<int64_t>(slice.full_extent - first_row, 0, shape_[slice.dim])
                             : shape_[slice.dim] / slice.stride);
}

memory::Shape Parameter::full_shape() const {
  memory::Shape full = shape_;
  if (!slice_.whole()) full[slice_.dim] = static_cast<int64_t>(full_dim_);
  return full;
}

int64_t Parameter::full_numel() const {
  if (slice_.full_extent == 0) return numel() * slice_.parts;
  int64_t n = 1;
  for (int64_t d : full_shape()) n *= d;
  return n;
}

void Parameter::init_values(std::span<float> out, uint64_t first, uint64_t seed) const {
  // Padding has no place in the full tensor: zeros (what a padded vocabulary's rows must stay).
  if (slice_.full_extent != 0) std::fill(out.begin(), out.end(), 0.0f);
  for_each_full_run(first, out.size(), [&](uint64_t local, uint64_t full, uint64_t n) {
    if (source_) {
      source_->read(*this, out.subspan(local - first, n), full);
    } else {
      init_.fill(out.subspan(local - first, n), full, seed, full_name_);
    }
  });
}

}  // namespace zs::nn
