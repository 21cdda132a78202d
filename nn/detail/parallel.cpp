#include "nn/detail/parallel.h"

#include <cblas.h>

#include <algorithm>

namespace zs::nn {
int compute_threads() { return std::max(1, openblas_get_num_threads()); }
}  // namespace zs::nn

namespace zs::nn::detail {

namespace {
thread_local bool t_kernels_enabled = true;  // Note [measuring run]: per thread, scoped by KernelsOff
}  // namespace

bool kernels_enabled() { return t_kernels_enabled; }
KernelsOff::KernelsOff() : saved_(t_kernels_enabled) { t_kernels_enabled = false; }
KernelsOff::~KernelsOff() { t_kernels_enabled = saved_; }

SingleThreadedBlas::SingleThreadedBlas() : saved_(compute_threads()) {
  if (saved_ > 1) openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (saved_ > 1) openblas_set_num_threads(saved_);
}

}  // namespace zs::nn::detail
