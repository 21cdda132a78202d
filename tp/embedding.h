// Megatron-LM's VocabParallelEmbedding: a lookup table (num, dim) split by rows over a tensor-parallel
// group.
//
//   auto& wte = add_child<tp::VocabParallelEmbedding>("wte", vocab, d, tp);   // weight (vocab/tp, d)
//   Tensor x = ctx.forward(wte, ids);   // ids (B, T) int32 -> (B, T, d); (B, T/tp, d) with sequence parallelism
//
// Rank r holds rows [r num/tp, (r + 1) num/tp) ("weight", normal(0, init_std), the slice of nn::Embedding's
// tensor: Note [tensor slices] in nn/parameter.h). Forward: each rank looks up the ids it owns (zeros
// for the others) and the group sums them: an all-reduce, or with sequence parallelism a reduce-scatter
// to this rank's sequence shard (ids must then be (B, T), T divisible by tp). Backward: each rank adds
// the rows of the ids it owns (after an all-gather of the shards with sequence parallelism); no other
// communication. Ids outside [0, num) throw ConfigError on every rank. With tp = 1: nn::Embedding.
#pragma once

#include <cstdint>

#include "memory/tensor.h"
#include "nn/module.h"
#include "tp/mappings.h"

namespace zs::tp {

class VocabParallelEmbedding : public nn::Module {
 public:
  // num_embeddings divisible by tp.size(): ModelError otherwise. padded_num > num_embeddings: the rows
  // are padded to padded_num (a multiple of tp.size(), tp::padded_vocab_size): padded_num / tp rows
  // per rank, the padding zeros that no id looks up (Note [padded vocabulary] in tp/cross_entropy.h).
  VocabParallelEmbedding(int64_t num_embeddings, int64_t dim, TensorParallel tp, float init_std = 0.02f,
                         int64_t padded_num = 0);
  std::string_view type_name() const override { return "VocabParallelEmbedding"; }
  nn::Parameter& weight() { return weight_; }
  int64_t first_row() const { return first_; }  // this rank's rows: [first_row, first_row + weight rows)

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& ids) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { ids_ = {}; }

 private:
  int64_t num_;
  int64_t dim_;
  TensorParallel tp_;
  int64_t first_;
  nn::Parameter& weight_;
  memory::Tensor ids_;
};

}  // namespace zs::tp
