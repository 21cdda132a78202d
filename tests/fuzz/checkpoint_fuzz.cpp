// Fuzz target: CheckpointReader (checkpoint/reader.h) opening a checkpoint one of whose files was
// replaced by the input, then reading every tensor of every buffer it says it holds. The contract: the
// only exception is CheckpointError (anything else, or a crash inside HDF5, is reported as a crash).
//
// The checkpoint is the synthetic one of tests/checkpoint/synthetic.h (2 ranks, zstd, small chunks),
// written once per process by the storage API into a private temporary directory (in /dev/shm where
// it is writable). An input is
//   byte 0: which file it replaces (mod 4: 0 zs_metadata.h5, 1 rank 0's file, 2 rank 1's, 3 `latest`)
//   the rest: that file's new contents.
// `checkpoint_fuzz --write-seeds DIR` writes one seed per file (the unmodified bytes) and exits.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/errors.h"
#include "checkpoint/checkpoint.h"
#include "tests/checkpoint/synthetic.h"

namespace fs = std::filesystem;

namespace {

constexpr const char* kTag = "global_step3";

struct Pristine {
  fs::path root;                              // the checkpoint's root (holds `latest` and the tag)
  std::vector<fs::path> files;                // by selector: metadata, rank 0, rank 1, latest
  std::vector<std::vector<uint8_t>> contents;  // their unmodified bytes
};

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "checkpoint_fuzz: cannot write %s\n", p.c_str());
    std::abort();
  }
}

// The directory is named after the process that made it: libFuzzer ends a run (time up, a crash, a
// hang) without running atexit handlers, so each run removes those of processes that are gone.
const std::string kDirPrefix = "zs-ckpt-fuzz-";

void remove_orphans(const fs::path& base) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(kDirPrefix)) continue;
    const long pid = std::strtol(name.c_str() + kDirPrefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

Pristine make_pristine() {
  // In memory (tmpfs) where the machine has one: every input rewrites a file, and on a disk that
  // rewrite (open with O_TRUNC) waited for the file's previous pages to be written back: one input
  // sat 185 s in open() while other tests wrote to the same disk, and libFuzzer called it a hang.
  const fs::path base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  remove_orphans(base);
  std::string tmpl = (base / (kDirPrefix + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
  Pristine p;
  p.root = tmpl;
  zs::test::save_synthetic(p.root, zs::test::synthetic_metadata(2, kTag, 3),
                           zs::checkpoint::WriteOptions{.compression = zs::checkpoint::Compression::kZstd,
                                                        .chunk_bytes = 256});
  const fs::path dir = p.root / kTag;
  std::vector<fs::path> ranks;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != "zs_metadata.h5") ranks.push_back(e.path());
  }
  std::sort(ranks.begin(), ranks.end());
  if (ranks.size() != 2 || !fs::exists(dir / "zs_metadata.h5") || !fs::exists(p.root / "latest")) {
    std::fprintf(stderr, "checkpoint_fuzz: the synthetic checkpoint under %s is not as expected\n", p.root.c_str());
    std::abort();
  }
  p.files = {dir / "zs_metadata.h5", ranks[0], ranks[1], p.root / "latest"};
  for (const fs::path& f : p.files) p.contents.push_back(read_bytes(f));
  return p;
}

Pristine& pristine() {
  static Pristine p = make_pristine();
  return p;
}

void read_everything() {
  zs::checkpoint::CheckpointReader reader(pristine().root);
  const zs::checkpoint::Metadata& meta = reader.metadata();
  std::vector<float> out;
  for (const auto& buffer : meta.layout.buffers) {
    for (const auto& tensor : meta.layout.tensors) {
      if (!reader.holds(buffer.name, tensor.name)) continue;
      const uint64_t n = tensor.numel();
      if (n > (uint64_t{1} << 24)) continue;  // a mutated shape: reading it would only test memory
      out.resize(n);
      reader.read(buffer.name, tensor.name, 0, n, zs::memory::DType::kF32, out.data());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (*argc == 3 && std::strcmp((*argv)[1], "--write-seeds") == 0) {
    const fs::path out = (*argv)[2];
    fs::create_directories(out);
    const Pristine& p = pristine();
    for (size_t i = 0; i < p.files.size(); ++i) {
      std::vector<uint8_t> seed{static_cast<uint8_t>(i)};
      seed.insert(seed.end(), p.contents[i].begin(), p.contents[i].end());
      write_bytes(out / ("seed-" + std::to_string(i)), seed.data(), seed.size());
    }
    fs::remove_all(p.root);
    std::exit(0);
  }
  std::atexit([] { fs::remove_all(pristine().root); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Pristine& p = pristine();
  const size_t which = data[0] % p.files.size();
  write_bytes(p.files[which], data + 1, size - 1);
  try {
    read_everything();
  } catch (const zs::CheckpointError&) {
    // The contract: a bad file is a CheckpointError.
  }
  const std::vector<uint8_t>& orig = p.contents[which];
  write_bytes(p.files[which], orig.data(), orig.size());
  return 0;
}
