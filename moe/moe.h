// zeroshard's Mixture of Experts (DeepSpeed-MoE semantics, expert parallelism over comm groups).
//
//   #include "moe/moe.h"
//   auto groups = world.split_groups(ep_size);                                // dp / ep / edp
//   moe::MoE& layer = add_child<moe::MoE>("moe", d, expert_factory,
//                                         moe::MoEOptions{.num_experts = 8, .ep_size = ep_size, .k = 2}, &groups);
//
// Parts: moe_layer.h (the module, its options and l_aux), gating.h (top-1/top-2/top-k gating and its
// backward), dispatch.h (the all-to-all exchange between ranks and experts), gpt_moe.h (a GPT whose MLPs
// are MoE layers every n blocks). docs/moe.md is the guide.
#pragma once

#include "moe/dispatch.h"
#include "moe/gating.h"
#include "moe/gpt_moe.h"
#include "moe/moe_layer.h"
