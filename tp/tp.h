// zeroshard's tensor parallelism: Megatron-LM's tensor- and sequence-parallel layers over a comm group.
//
//   #include "tp/tp.h"
//   comm::Topology topo(world.group(), {.tensor_parallel_size = 2});
//   tp::TensorParallel tp{.group = &topo.tensor_parallel(), .sequence_parallel = false};
//   auto& fc = add_child<tp::ColumnParallelLinear>("fc", d, 4 * d, tp);
//   auto& proj = add_child<tp::RowParallelLinear>("proj", 4 * d, d, tp);
//
// Parts: mappings.h (TensorParallel, the collectives between the pieces, sequence shards), linear.h
// (column- and row-parallel linears), embedding.h (vocab-parallel embedding), cross_entropy.h
// (vocab-parallel softmax cross-entropy), transformer.h (attention, MLP, block, sequence-parallel
// layer norm), gpt.h (the built-in GPT, tensor-parallel, and tp::validate), llama.h (LLaMA,
// tensor-parallel). docs/tensor_parallel.md is the guide.
#pragma once

#include "tp/cross_entropy.h"
#include "tp/embedding.h"
#include "tp/gpt.h"
#include "tp/linear.h"
#include "tp/llama.h"
#include "tp/mappings.h"
#include "tp/transformer.h"
