// checkpoint_fixture ROOT: writes the synthetic checkpoint (3 ranks, tag global_step5, zstd) under
// ROOT, for the h5py check (h5py_check.py), which recomputes synthetic_value.
#include <cstdio>

#include "tests/checkpoint/synthetic.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_fixture ROOT\n");
    return 2;
  }
  zs::test::save_synthetic(argv[1], zs::test::synthetic_metadata(3, "global_step5", 5),
                           zs::checkpoint::WriteOptions{.compression = zs::checkpoint::Compression::kZstd,
                                                        .chunk_bytes = 1000});
  return 0;
}
