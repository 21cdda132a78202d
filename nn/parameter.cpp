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

}  // namespace zs::nn
