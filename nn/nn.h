// zs::nn: the Module API models implement, layers on OpenBLAS, the GPT builder and LM data.
//
//   zs::nn::GptModel model(zs::nn::GptConfig{.n_layer = 2, .d_model = 64, .n_head = 4, .seq_len = 64});
//   zs::nn::materialize(model, /*seed=*/1);
//   auto data = zs::nn::Dataset::builtin(64);
//   zs::nn::Batch batch;
//   data.fill_batch(batch, /*seed=*/1, /*step=*/0, /*first_global_sample=*/0, /*batch_size=*/8);
//   zs::nn::HostContext ctx;
//   float loss = ctx.forward_loss(model, batch);
//   ctx.backward_loss(model, 1.0f);       // grads accumulate into each Parameter::grad()
//
// Parts: parameter.h (Parameter, Init), module.h (Module, Sequential, assign_names, materialize),
// context.h (Context, MemoryUse: the engine's seam), host_context.h, model.h (Model, Batch),
// param_access.h (weight_f32, GradAccumulator), layers.h (Linear, Embedding, LayerNorm, Gelu),
// attention.h, transformer.h (Mlp, Block), cross_entropy.h, gpt.h (GPT and GPT-2), llama.h (LLaMA: RmsNorm,
// SwiGluMlp, GqaAttention), data.h, flops.h (FLOP counter).
#pragma once

#include "nn/attention.h"
#include "nn/context.h"
#include "nn/cross_entropy.h"
#include "nn/data.h"
#include "nn/flops.h"
#include "nn/gpt.h"
#include "nn/host_context.h"
#include "nn/layers.h"
#include "nn/llama.h"
#include "nn/model.h"
#include "nn/module.h"
#include "nn/param_access.h"
#include "nn/parameter.h"
#include "nn/transformer.h"
