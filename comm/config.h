// Plain settings and result structs of the comm module (the `comm` config section).
#pragma once

#include <cstdint>
#include <string>

namespace zs::comm {

struct CommConfig {
  // Seconds a collective may wait for the other ranks of its group before it throws CommError
  // naming the collective, the group, the sizes and the rank. Must be > 0.
  double timeout_s = 300.0;
};

// How a reduction combines the ranks' values. kAverage is the sum divided by the group size, done in
// fp32 (integers support kSum only).
enum class ReduceOp { kSum, kAverage };

// Per-rank byte sums since the World started (or reset_counters). Counting rule, chosen to match the
// NCCL-tests bus-bandwidth definitions: the bytes a ring (or pipeline) algorithm moves, in the element
// type put on the wire (fp32 for bf16/fp16 reductions, which accumulate in fp32), per collective:
//   allreduce of B bytes on N ranks          sent = received = 2 (N-1)/N * B
//   reduce-scatter, allgather(v)             sent = received = total bytes - this rank's own part
//   broadcast of B bytes (a chain from root) sent = B except the last rank of the chain, received = B
//                                            except the root
//   all-to-all(v)                            sent = bytes to other ranks, received = bytes from others
//   barrier, and the 64-byte handshake every collective starts with (Note [Handshake]): not counted.
//   OneBitAllreduce (comm/compressed_allreduce.h) counts as the all-to-all and the allgather it is
//   made of: sent = received = 2 (N-1) (chunk/8 + 4) for chunks of `chunk` elements (~1/32 of fp32).
// A world or group of one moves nothing and counts nothing.
struct CommCounters {
  uint64_t bytes_sent = 0;      // bytes
  uint64_t bytes_received = 0;  // bytes
  uint64_t collectives = 0;     // count of completed collectives (all groups)
};

// One collective's tally on this rank since the World started (or reset_counters): what DeepSpeed's
// comms_logger reports. Always on: one clock read before and after each collective, next to the
// handshake's microsecond, is noise. `seconds` spans the handshake and the body (DeepSpeed's latency
// also includes waiting for late ranks); `bytes_sent` follows the CommCounters rule above, so
// bytes_sent / seconds is NCCL-tests' bus bandwidth.
struct OpStats {
  std::string name;         // "allreduce", "reduce_scatter", "allgather", "allgatherv", "broadcast", ...
  uint64_t count = 0;       // count of completed collectives
  uint64_t bytes_sent = 0;  // bytes
  double seconds = 0.0;     // wall time, summed over the collectives
};

}  // namespace zs::comm
