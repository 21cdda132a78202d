#include "memory/cpu_features.h"

#include <atomic>
#include <string>

#include "core/errors.h"

namespace zs::memory {
namespace {

// GCC's __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0), so an
// AVX-512 CPU under an OS or hypervisor that disables the state reports false here.
struct Features {
  bool avx2_f16c = false;
  bool avx512 = false;
  bool avx512_bf16 = false;
};

Features detect() {
  __builtin_cpu_init();
  Features f;
  f.avx2_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  f.avx512 = f.avx2_f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  return f;
}

const Features& features() {
  static const Features f = detect();  // thread-safe one-time initialisation
  return f;
}

// Note [ISA cap]
// Tests must also run the library's narrower SIMD path on a wide CPU (the AVX2 kernels on an AVX-512
// machine), end to end, and the library reads no environment. The automatic choice is made in one
// place (best_isa) and then kept (dtype.cpp resolves its conversion kernels once, an optimizer takes
// its ISA when it is built), so the cap is a process-wide setting with one rule: it is written before
// the first best_isa() and never after. It is then as immutable as the CPU features themselves, and
// a process never mixes kernels chosen before and after a change. An edge (a test's main reading
// --isa, a tool flag) sets it; passing an IsaLevel through every config would reach the same kernels
// through many more signatures. Kernels asked for explicitly (tests passing an IsaLevel) ignore it.
std::atomic<IsaLevel> g_cap{IsaLevel::kAvx512};
std::atomic<bool> g_chosen{false};  // best_isa() was called: the cap is final

IsaLevel widest_supported() {
  if (cpu_has_avx512()) return IsaLevel::kAvx512;
  if (cpu_has_avx2_f16c()) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

}  // namespace

bool cpu_has_avx512() { return features().avx512; }
bool cpu_has_avx2_f16c() { return features().avx2_f16c; }
bool cpu_has_avx512_bf16() { return features().avx512_bf16; }

bool isa_supported(IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kScalar: return true;
    case IsaLevel::kAvx2: return cpu_has_avx2_f16c();
    case IsaLevel::kAvx512: return cpu_has_avx512();
  }
  return false;
}

IsaLevel best_isa() {
  g_chosen.store(true);
  return std::min(widest_supported(), g_cap.load());
}

void set_isa_cap(IsaLevel cap) {
  ZS_ASSERT(!g_chosen.load(), "set_isa_cap({}) after best_isa() was used: kernels may be chosen already; set the "
            "cap first thing in main", isa_name(cap));
  g_cap.store(cap);
}

std::vector<IsaLevel> supported_isas() {
  std::vector<IsaLevel> out;
  for (IsaLevel isa : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

std::string_view isa_name(IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kScalar: return "scalar";
    case IsaLevel::kAvx2: return "avx2";
    case IsaLevel::kAvx512: return "avx512";
  }
  return "unknown";
}

IsaLevel parse_isa(std::string_view name, std::string_view what) {
  for (IsaLevel isa : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (isa_name(isa) != name) continue;
    if (!isa_supported(isa)) {
      throw ConfigError(fmt::format("{}: instruction set '{}' is not supported by this CPU; use one of the supported "
                                    "levels (best here: '{}')",
                                    what, name, isa_name(widest_supported())));
    }
    return isa;
  }
  throw ConfigError(fmt::format("{}: unknown instruction set '{}'; expected scalar, avx2 or avx512", what, name));
}

}  // namespace zs::memory
