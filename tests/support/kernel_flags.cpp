// See kernel_flags.h.
#include "tests/support/kernel_flags.h"

#include <cstdio>
#include <string>
#include <string_view>

#include "memory/cpu_features.h"

extern "C" char* openblas_get_corename(void);

namespace zs::test {
namespace {

// The instruction set an OpenBLAS core type's kernels need; kScalar for the ones every x86-64 runs.
memory::IsaLevel isa_needed_by(std::string_view core) {
  using memory::IsaLevel;
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

int take_kernel_flags(int& argc, char** argv) {
  std::string isa_arg, core_arg;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (take_flag(arg, "--isa=", isa_arg) || take_flag(arg, "--blas-core=", core_arg)) continue;
    argv[kept++] = argv[i];
  }
  argc = kept;
  using memory::isa_name;
  if (!core_arg.empty()) {
    const memory::IsaLevel need = isa_needed_by(core_arg);
    if (!memory::isa_supported(need)) {
      std::printf("SKIPPED: OpenBLAS '%s' kernels need %s, which this CPU lacks\n", core_arg.c_str(),
                  std::string(isa_name(need)).c_str());
      return kKernelSkipCode;
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
    memory::IsaLevel isa = memory::IsaLevel::kScalar;
    try {
      isa = memory::parse_isa(isa_arg, "--isa");
    } catch (const std::exception& e) {
      if (isa_arg == "avx2" || isa_arg == "avx512") {
        std::printf("SKIPPED: %s\n", e.what());  // a known level this CPU does not have
        return kKernelSkipCode;
      }
      std::printf("FAILED: %s\n", e.what());
      return 2;
    }
    // On a CPU whose best is AVX2 the unpinned run (`t`) is already this one: the same library kernels,
    // OpenBLAS's AVX2 kernels (Haswell's, or Zen's, which are Haswell's), and no bf16 kernel for
    // ZS_BF16_GEMM=native to force. Running it twice would only double make test's longest tests there.
    if (isa == memory::IsaLevel::kAvx2 && !memory::isa_supported(memory::IsaLevel::kAvx512)) {
      std::printf("SKIPPED: this CPU's best kernel set is AVX2, which the run without --isa already tests\n");
      return kKernelSkipCode;
    }
    memory::set_isa_cap(isa);
  }
  if (!isa_arg.empty() || !core_arg.empty()) {
    std::printf("kernels: library %s, OpenBLAS %s\n", std::string(isa_name(memory::best_isa())).c_str(),
                openblas_get_corename());
  }
  return -1;
}

}  // namespace zs::test
