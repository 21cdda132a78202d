// The built-in language models' input checks (GPT, LLaMA and their tensor-parallel, pipeline and MoE
// forms): one wording, with the model's name, for every model that takes token ids.
#pragma once

#include "core/errors.h"
#include "memory/tensor.h"
#include "nn/model.h"

namespace zs::nn::detail {

// inputs: contiguous int32 token ids of shape (B, T).
inline void check_token_ids(const memory::Tensor& ids, const char* model) {
  ZS_MODEL_CHECK(ids.raw() != nullptr && ids.dtype() == memory::DType::kI32 && ids.dim() == 2 && ids.is_contiguous(),
                 "{}: inputs must be contiguous int32 token ids (B, T), got a {} tensor {}", model,
                 memory::dtype_name(ids.dtype()), memory::shape_string(ids.shape()));
}

// The ids as above, and targets of the same shape.
inline void check_token_batch(const Batch& batch, const char* model) {
  check_token_ids(batch.inputs, model);
  ZS_MODEL_CHECK(batch.targets.raw() != nullptr && batch.targets.shape() == batch.inputs.shape(),
                 "{}: targets {} must match inputs {}", model, memory::shape_string(batch.targets.shape()),
                 memory::shape_string(batch.inputs.shape()));
}

}  // namespace zs::nn::detail
