// gtest main for tests registered with KERNEL_VARIANTS (cmake/ZeroshardHelpers.cmake): the same
// binary runs once per kernel set, chosen by two flags that ctest passes.
//
//   --isa=avx2|avx512|scalar   caps the library's own SIMD dispatch (memory::set_isa_cap, Note [ISA cap]
//                              in memory/cpu_features.cpp) before any kernel is chosen
//   --blas-core=NAME           the OpenBLAS kernels this run is meant for; ctest sets OPENBLAS_CORETYPE
//                              in the test's environment (OpenBLAS reads it when it loads, before main),
//                              and this main checks that it took effect
//
// A variant the CPU cannot run (AVX-512 on an AVX2 machine) exits with kSkipCode after saying why;
// ctest reports it as skipped (SKIP_RETURN_CODE), never as passed. A kernel set that was asked for but
// not loaded is a failure: the run would otherwise test other kernels than its name says.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <string_view>

#include "memory/cpu_features.h"

extern "C" char* openblas_get_corename(void);

namespace {

constexpr int kSkipCode = 77;

// The instruction set an OpenBLAS core type's kernels need; kScalar for the ones every x86-64 runs.
zs::memory::IsaLevel isa_needed_by(std::string_view core) {
  using zs::memory::IsaLevel;
  if (core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids") return IsaLevel::kAvx512;
  if (core == "Haswell" || core == "Zen") return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

bool take_flag(std::string_view arg, std::string_view name, std::string& value) {
  if (arg.substr(0, name.size()) != name) return false;
  value = std::string(arg.substr(name.size()));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // removes gtest's own flags
  std::string isa_arg, core_arg;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (take_flag(arg, "--isa=", isa_arg) || take_flag(arg, "--blas-core=", core_arg)) continue;
    std::fprintf(stderr, "unknown argument '%s' (this main takes --isa=LEVEL and --blas-core=NAME)\n", argv[i]);
    return 2;
  }
  using zs::memory::isa_name;
  using zs::memory::isa_supported;
  if (!core_arg.empty()) {
    const zs::memory::IsaLevel need = isa_needed_by(core_arg);
    if (!isa_supported(need)) {
      std::printf("SKIPPED: OpenBLAS '%s' kernels need %s, which this CPU lacks\n", core_arg.c_str(),
                  std::string(isa_name(need)).c_str());
      return kSkipCode;
    }
    const char* loaded = openblas_get_corename();
    if (loaded == nullptr || core_arg != loaded) {
      std::printf("FAILED: this run is for OpenBLAS '%s' kernels but OpenBLAS loaded '%s'; set "
                  "OPENBLAS_CORETYPE=%s before starting (ctest does)\n",
                  core_arg.c_str(), loaded != nullptr ? loaded : "?", core_arg.c_str());
      return 1;
    }
  }
  if (!isa_arg.empty()) {
    zs::memory::IsaLevel isa = zs::memory::IsaLevel::kScalar;
    try {
      isa = zs::memory::parse_isa(isa_arg, "--isa");
    } catch (const std::exception& e) {
      if (isa_arg == "avx2" || isa_arg == "avx512") {
        std::printf("SKIPPED: %s\n", e.what());  // a known level this CPU does not have
        return kSkipCode;
      }
      std::printf("FAILED: %s\n", e.what());
      return 2;
    }
    zs::memory::set_isa_cap(isa);
  }
  std::printf("kernels: library %s, OpenBLAS %s\n", std::string(isa_name(zs::memory::best_isa())).c_str(),
              openblas_get_corename());
  return RUN_ALL_TESTS();
}
