// zs::optim: optimizers over flat fp32 partitions, their registry, learning-rate schedules, loss
// scaling and clipping math. Knows nothing of MPI or sharding; the engine passes chunks and agreed
// global values (and, for the compressed optimizers, runs the collectives between their kernels).
//
//   optimizer.h      Optimizer interface, StateSpec, ParamChunk, StepContext
//   registry.h       OptimizerType per config type name, find_optimizer_type, read_optimizer
//   adam.h           Adam / AdamW (AdamConfig); fused_adam.h: its one-pass AVX-512/AVX2/scalar kernels
//   lion.h           Lion (LionConfig); fused_lion.h: its one-pass AVX-512/AVX2/scalar kernels
//   lamb.h           Lamb (LambConfig): per-tensor trust ratio, two passes (Note [per-tensor optimizers])
//   cadam.h          CAdam, the compressed-state optimizer (CAdamConfig)
//   onebit_adam.h    1-bit Adam and 0/1 Adam configs and the per-element kernels both are built from;
//                    zero_one_adam.h: 0/1 Adam's schedule (ZeroOneSchedule)
//   lr_schedule.h    learning-rate schedules (DeepSpeed's scheduler types)
//   loss_scaler.h    LossScaler: static and dynamic fp16 loss scaling
//   clip.h           sum_of_squares, has_inf_or_nan, clip_coefficient
#pragma once

#include "optim/adam.h"
#include "optim/cadam.h"
#include "optim/clip.h"
#include "optim/fused_adam.h"
#include "optim/fused_lion.h"
#include "optim/lamb.h"
#include "optim/lion.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/onebit_adam.h"
#include "optim/optimizer.h"
#include "optim/registry.h"
#include "optim/zero_one_adam.h"
