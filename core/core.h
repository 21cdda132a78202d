// The public parts of zeroshard's core module (namespace zs):
//   errors.h  typed errors (ConfigError, IoError, ...), ZS_ASSERT, ZS_DEBUG_ASSERT, ZS_SYS_CHECK
//   log.h     rank-aware spdlog logging: init_logging, logger, ZS_LOG_INFO, ...
//   json.h    strict JSON parsing (duplicate keys rejected) and ObjectReader for config structs
//   parallel.h a small worker pool for data-parallel loops (explicit thread count)
//   rng.h     counter-based Philox RNG keyed by (seed, parameter name) for shard-local initialisation
//   spin.h    cpu_relax, the pause between polls of a spin-wait
#pragma once

#include "core/errors.h"
#include "core/json.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/spin.h"
