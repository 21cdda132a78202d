// Per-ISA loops behind the one-bit / 0/1 Adam kernels of optim/onebit_adam.h (internal).
//
// CompressedLoops<Isa> is defined in detail/onebit_loops.h and explicitly instantiated once per ISA,
// each in a file compiled with that ISA's flags (onebit_kernels_<isa>.cpp). The tag is part of every
// mangled name, so the copies built for different ISAs can never be merged by the linker. Call a
// wide ISA's loops only when memory::isa_supported() says so.
#pragma once

#include "memory/cpu_features.h"
#include "optim/onebit_adam.h"

namespace zs::optim::detail {

struct ScalarIsa {
  static constexpr memory::IsaLevel kIsa = memory::IsaLevel::kScalar;
};
struct Avx2Isa {
  static constexpr memory::IsaLevel kIsa = memory::IsaLevel::kAvx2;
};
struct Avx512Isa {
  static constexpr memory::IsaLevel kIsa = memory::IsaLevel::kAvx512;
};

template <class Isa>
struct CompressedLoops {
  static void adam_update(const CompressedChunk& c, const CompressedConstants& k);
  static void momentum_update(const CompressedChunk& c, const CompressedConstants& k);
  static void frozen_update(const CompressedChunk& c, const CompressedConstants& k);
  static void local_step(const CompressedChunk& c, const CompressedConstants& k);
  static void sync_prepare(const CompressedChunk& c, const CompressedConstants& k);
  static void local_step_sync_prepare(const CompressedChunk& c, const CompressedConstants& k);
  static void sync_finish(const CompressedChunk& c, const CompressedConstants& k);
};

extern template struct CompressedLoops<ScalarIsa>;
extern template struct CompressedLoops<Avx2Isa>;
extern template struct CompressedLoops<Avx512Isa>;

}  // namespace zs::optim::detail
