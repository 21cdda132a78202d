// Question: does `zeroshard checkpoint consolidate` stay within bounded memory on a checkpoint larger
// than half the machine's RAM? A synthetic fp32 checkpoint of --size bytes (--tensors 2-D tensors of
// rows of --row floats, tensor 0 twice the others, cut unevenly over --ranks rank files) is written
// through the real storage path (begin_save, ShardWriter::append in 64 MiB pieces generated on the
// fly, write_metadata, commit_save) under --dir, then `zeroshard checkpoint consolidate DIR OUT.h5`
// runs as a child process and its peak RSS is read from wait4's rusage (ru_maxrss). The output is
// checked at sampled elements of every tensor against the generating formula. Both files are deleted
// afterwards (--keep 1 keeps them). Exit 1 when the peak exceeds --max-rss.
//
// Baseline, same run: the machine's RAM and the checkpoint's bytes (the memory a whole-model
// consolidation, DeepSpeed's zero_to_fp32, needs at least). Ratios: peak RSS / checkpoint bytes, and
// peak RSS / --max-rss (target < 1).
//
//   checkpoint_consolidate_bench [--size 13G] [--ranks 4] [--tensors 16] [--row 4096] [--dir DIR]
//                                [--zeroshard PATH] [--max-rss 1G] [--keep 0] [--json FILE]
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "benchmarks/support/bench_args.h"
#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/h5.h"

namespace {

namespace fs = std::filesystem;
namespace ck = zs::checkpoint;
using zs::bench::now_seconds;

// Element e of tensor t: exact in fp32, different across tensors and positions.
float value(uint32_t t, uint64_t e) { return static_cast<float>((e * 7 + t * 1000003u) % 16777213u) - 8e6f; }

ck::Metadata make_layout(uint64_t bytes, int ranks, int tensors, uint64_t row) {
  ck::Metadata meta;
  meta.run_id = ck::new_run_id();
  meta.tag = "global_step1";
  meta.layout.world_size = ranks;
  const uint64_t rows_total = bytes / sizeof(float) / row;
  const uint64_t unit = rows_total / static_cast<uint64_t>(tensors + 1);  // tensor 0 gets 2 units
  uint64_t used = 0;
  for (int t = 0; t < tensors; ++t) {
    uint64_t rows = t == 0 ? 2 * unit : t == tensors - 1 ? rows_total - used : unit;
    used += rows;
    meta.layout.tensors.push_back({"layers." + std::to_string(t) + ".w", {rows, row}, zs::memory::DType::kF32});
  }
  uint64_t total = rows_total * row, flat = 0, weights = static_cast<uint64_t>(ranks) * (ranks + 1) / 2;
  std::vector<uint64_t> cuts{0};
  for (int r = 0, acc = 0; r < ranks; ++r) cuts.push_back(total * static_cast<uint64_t>(acc += r + 1) / weights);
  std::vector<std::vector<ck::Segment>> segs(static_cast<size_t>(ranks));
  for (uint32_t t = 0; t < meta.layout.tensors.size(); ++t) {
    uint64_t n = meta.layout.tensors[t].numel();
    for (int r = 0; r < ranks; ++r) {
      uint64_t lo = std::max(flat, cuts[static_cast<size_t>(r)]), hi = std::min(flat + n, cuts[static_cast<size_t>(r) + 1]);
      if (lo < hi) segs[static_cast<size_t>(r)].push_back({t, lo - flat, hi - lo});
    }
    flat += n;
  }
  meta.layout.buffers.push_back({"fp32", zs::memory::DType::kF32, segs});
  meta.scalars = {{"global_step", int64_t{1}}};
  return meta;
}

void write_checkpoint(const fs::path& root, const ck::Metadata& meta) {
  fs::path dir = ck::begin_save(root, meta.tag);
  std::vector<float> piece(16u << 20);  // 64 MiB
  for (int r = 0; r < meta.layout.world_size; ++r) {
    ck::ShardWriter w(dir, meta, r, ck::WriteOptions{});
    for (const ck::Segment& s : meta.layout.buffers[0].ranks[static_cast<size_t>(r)]) {
      for (uint64_t e = 0; e < s.count; e += piece.size()) {
        uint64_t n = std::min<uint64_t>(piece.size(), s.count - e);
        for (uint64_t i = 0; i < n; ++i) piece[i] = value(s.tensor, s.begin + e + i);
        w.append("fp32", std::as_bytes(std::span<const float>(piece.data(), n)));
      }
    }
    w.finish();
  }
  ck::write_metadata(dir, meta);
  ck::commit_save(root, meta.tag, 0);
}

// Runs `argv` as a child; returns its peak RSS in bytes (throws on a failed exit).
uint64_t run_child_peak_rss(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw zs::IoError("fork failed");
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    std::perror("execv");
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage{};
  if (::wait4(pid, &status, 0, &usage) < 0) throw zs::IoError("wait4 failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw zs::InternalError("checkpoint_consolidate_bench: '" + args[0] + " " + args[1] + " " + args[2] + "' failed");
  }
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

// Sampled elements of every tensor of the consolidated file against value().
void check_output(const fs::path& out, const ck::Metadata& meta) {
  namespace h5 = ck::h5;
  h5::Handle file = h5::file_open(out);
  std::mt19937_64 rng(3);
  for (uint32_t t = 0; t < meta.layout.tensors.size(); ++t) {
    const ck::TensorInfo& info = meta.layout.tensors[t];
    h5::Handle ds = h5::dataset_open(file.get(), info.name.c_str(), out);
    h5::Handle space = h5::dataset_space(ds.get(), out, info.name);
    for (int k = 0; k < 64; ++k) {
      uint64_t e = k == 0 ? 0 : k == 1 ? info.numel() - 1 : rng() % info.numel();
      hsize_t coord[2] = {e / info.shape[1], e % info.shape[1]};
      ZS_H5_CHECK(H5Sselect_elements(space.get(), H5S_SELECT_SET, 1, coord), out, "select");
      h5::Handle mem = h5::dataspace_simple({1});
      float got = 0;
      ZS_H5_CHECK(H5Dread(ds.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, &got), out, "read");
      if (got != value(t, e)) {
        throw zs::InternalError("checkpoint_consolidate_bench: " + info.name + " element " + std::to_string(e) +
                                " is " + std::to_string(got) + ", expected " + std::to_string(value(t, e)));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const uint64_t size = zs::bench::parse_size(zs::bench::arg_value(argc, argv, "--size", "13G"));
  const int ranks = static_cast<int>(zs::bench::int_arg(argc, argv, "--ranks", 4));
  const int tensors = static_cast<int>(zs::bench::int_arg(argc, argv, "--tensors", 16));
  const uint64_t row = static_cast<uint64_t>(zs::bench::int_arg(argc, argv, "--row", 4096));
  const uint64_t max_rss = zs::bench::parse_size(zs::bench::arg_value(argc, argv, "--max-rss", "1G"));
  const bool keep = zs::bench::int_arg(argc, argv, "--keep", 0, 0) != 0;
  const fs::path exe_dir = fs::canonical("/proc/self/exe").parent_path();
  const std::string zeroshard =
      zs::bench::arg_value(argc, argv, "--zeroshard", (exe_dir.parent_path() / "tools" / "zeroshard").string());
  const fs::path base = zs::bench::arg_value(argc, argv, "--dir", exe_dir.string());
  const fs::path work = base / "checkpoint_consolidate_bench.tmp";
  const uint64_t ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

  fs::remove_all(work);
  ck::Metadata meta = make_layout(size, ranks, tensors, row);
  double t0 = now_seconds();
  write_checkpoint(work / "ckpt", meta);
  const double write_s = now_seconds() - t0;
  const uint64_t ckpt_bytes = ck::CheckpointReader(work / "ckpt").stored_bytes();
  uint64_t largest = 0;
  for (const auto& t : meta.layout.tensors) largest = std::max<uint64_t>(largest, t.numel() * sizeof(float));

  t0 = now_seconds();
  const uint64_t peak = run_child_peak_rss({zeroshard, "checkpoint", "consolidate", (work / "ckpt").string(),
                                            (work / "full.h5").string()});
  const double consolidate_s = now_seconds() - t0;
  check_output(work / "full.h5", meta);
  if (!keep) fs::remove_all(work);

  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::printf("checkpoint_consolidate_bench: %.2f GiB checkpoint (%d rank files, %d tensors, largest %.2f GiB) on a "
              "machine with %.1f GiB RAM (%.2fx)\n",
              static_cast<double>(ckpt_bytes) / gib, ranks, tensors, static_cast<double>(largest) / gib,
              static_cast<double>(ram) / gib, static_cast<double>(ckpt_bytes) / static_cast<double>(ram));
  std::printf("  written in %.1f s (%.2f GB/s); consolidated in %.1f s (%.2f GB/s)\n", write_s,
              static_cast<double>(ckpt_bytes) / write_s / 1e9, consolidate_s,
              static_cast<double>(ckpt_bytes) / consolidate_s / 1e9);
  std::printf("  consolidate peak RSS %.1f MiB (limit %.0f MiB): %s\n", static_cast<double>(peak) / (1 << 20),
              static_cast<double>(max_rss) / (1 << 20), peak <= max_rss ? "ok" : "OVER");

  std::string json = zs::bench::json_path_arg(argc, argv);
  if (!json.empty()) {
    zs::bench::Report r;
    r.benchmark = "checkpoint_consolidate_bench";
    r.config = {{"size", size}, {"ranks", ranks}, {"tensors", tensors}, {"row", row}, {"max_rss_bytes", max_rss}};
    r.baseline = {{"ram_bytes", ram}, {"checkpoint_bytes", ckpt_bytes}, {"largest_tensor_bytes", largest}};
    r.results.push_back({{"name", "consolidate"}, {"peak_rss_bytes", peak}, {"seconds", consolidate_s},
                         {"gbps", static_cast<double>(ckpt_bytes) / consolidate_s / 1e9}, {"write_seconds", write_s}});
    r.ratio = {{"checkpoint_over_ram", static_cast<double>(ckpt_bytes) / static_cast<double>(ram)},
               {"peak_rss_over_checkpoint", static_cast<double>(peak) / static_cast<double>(ckpt_bytes)},
               {"peak_rss_over_limit", static_cast<double>(peak) / static_cast<double>(max_rss)}};
    r.write(json);
  }
  return peak <= max_rss ? 0 : 1;
} catch (const zs::Error& e) {
  std::fprintf(stderr, "checkpoint_consolidate_bench: %s\n", e.what());
  return 1;
}
