#include "launch/launch.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

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

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {  // no affinity to read: every online CPU
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

int local_rank_count() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MPI_LOCAL_NRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (int n = env_int(name)) return n;
  }
  return 1;
}

int set_blas_threads(int local_ranks) {
  const std::vector<int> cpus = allowed_cpus();
  const int online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Note [rank CPU share]: a launcher that bound this rank to fewer CPUs than the node has (OpenMPI
  // binds each rank to one core when ranks <= 2, so `mpirun -np 1` gets one core of two) already gave
  // it its share; otherwise the ranks split the node's CPUs evenly.
  const bool launcher_bound = static_cast<int>(cpus.size()) < online;
  int threads = env_int("OPENBLAS_NUM_THREADS");
  if (threads == 0) {
    threads = launcher_bound ? static_cast<int>(cpus.size())
                             : std::max(1, static_cast<int>(cpus.size()) / std::max(1, local_ranks));
    openblas_set_num_threads(threads);
    // Under OpenMPI's mpirun, say how to use the CPUs no rank was given (a container's cpuset is
    // not the launcher's doing, and --bind-to would not help there).
    if (launcher_bound && static_cast<int>(cpus.size()) * std::max(1, local_ranks) < online &&
        std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
      ZS_LOG_INFO("this rank may run on {} of the node's {} CPUs (mpirun's binding): {} compute thread(s); "
                  "`mpirun --bind-to none` lets the ranks share all of them",
                  cpus.size(), online, threads);
    }
  }
  return threads;
}

}  // namespace zs::launch
