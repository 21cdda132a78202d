// The comm module: MPI world and groups, collectives on Tensors (sync and async), counters, and the
// one-bit compressed allreduce.
//
//   auto world = zs::comm::World::create({.timeout_s = 300});
//   auto [dp, ep, edp] = world.split_groups(2);
//   zs::comm::Work w = dp.allreduce_async(bucket, zs::comm::ReduceOp::kAverage);
//   ...compute...
//   w.wait();
//   auto c = world.counters();   // c.bytes_sent, c.bytes_received
#pragma once

#include "comm/agree.h"       // run_agreed, agree_outcome: one outcome across ranks
#include "comm/compressed_allreduce.h"  // OneBitAllreduce: 1-bit compressed allreduce
#include "comm/config.h"      // CommConfig, ReduceOp, CommCounters
#include "comm/group.h"       // Group: collectives
#include "comm/mpi_check.h"   // ZS_MPI_CHECK
#include "comm/native.h"      // native_handle: the MPI communicator of a Group
#include "comm/quantize.h"    // int8 block quantisation (ZeRO++'s wire format)
#include "comm/quantized_collectives.h"  // QuantizedAllgather, QuantizedReduceScatter (ZeRO++)
#include "comm/shared_arena.h"  // SharedArena: direct shared-memory collectives on device memory
#include "comm/shared_shards.h"  // SharedShards: one-sided gathers of shards in the shared arena
#include "comm/topology.h"    // Topology: the dp/tp/pp/ep/edp groups in Megatron's rank order
#include "comm/work.h"        // Work, Status
#include "comm/world.h"       // World, ExpertGroups
