// optim: optimizers (Adam/AdamW, CAdam, Lion) over flat fp32 partitions, their registry (registry.h),
// learning-rate schedules, loss scaling, clipping math.
// Knows nothing of MPI or sharding; the engine passes chunks and agreed global values.
#pragma once

#include "optim/adam.h"
#include "optim/cadam.h"
#include "optim/clip.h"
#include "optim/fused_adam.h"
#include "optim/fused_lion.h"
#include "optim/lion.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/onebit_adam.h"
#include "optim/optimizer.h"
#include "optim/registry.h"
#include "optim/zero_one_adam.h"
