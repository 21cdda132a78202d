#include "launch/launch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/log.h"
#include "memory/cpu_features.h"

extern "C" {
char* openblas_get_corename(void);
void openblas_set_num_threads(int num_threads);
}

namespace zs::launch {
namespace {

// Kernel families in increasing strength; anything unknown counts as weakest.
int core_rank(const std::string& core) {
  if (core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids") return 3;
  if (core == "Haswell" || core == "Zen") return 2;
  return 1;
}

// log2 of the cycles an idle OpenBLAS thread polls before it sleeps (Note [OpenBLAS idle threads]).
constexpr const char* kBlasThreadTimeout = "18";

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0' && n > 0 && n < 1 << 20) ? static_cast<int>(n) : 0;
}

}  // namespace

std::string preferred_blas_core() {
  if (memory::cpu_has_avx512()) return "SkylakeX";
  if (memory::cpu_has_avx2_f16c()) return "Haswell";
  return "";
}

std::string loaded_blas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

void select_blas_kernels(char** argv) {
  bool reexec = false;
  std::string want;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {  // else the user's choice, or our re-exec
    want = preferred_blas_core();
    if (!want.empty() && core_rank(loaded_blas_core()) < core_rank(want)) {
      ::setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
      reexec = true;
    }
  }
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {  // Note [OpenBLAS idle threads]
    ::setenv("OPENBLAS_THREAD_TIMEOUT", kBlasThreadTimeout, 1);
    reexec = true;
  }
  if (!reexec) return;
  ::execv("/proc/self/exe", argv);
  // Still here: exec failed (no /proc, say). Train on with the slower kernels, but say so.
  if (!want.empty()) {
    ZS_LOG_WARN("OpenBLAS loaded '{}' kernels on a CPU that supports '{}' and re-executing failed; set "
                "OPENBLAS_CORETYPE={} before starting for up to 2x faster matrix products",
                loaded_blas_core(), want, want);
  }
}

int local_rank_count() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MPI_LOCAL_NRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (int n = env_int(name)) return n;
  }
  return 1;
}

int set_blas_threads(int local_ranks) {
  if (int n = env_int("OPENBLAS_NUM_THREADS")) return n;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = std::max(1, cores / std::max(1, local_ranks));
  openblas_set_num_threads(threads);
  return threads;
}

}  // namespace zs::launch
