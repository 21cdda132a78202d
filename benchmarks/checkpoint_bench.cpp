// Question: how close do checkpoint save and load come to plain file I/O of the same bytes, and what
// do zstd's ratio and speed look like? A synthetic model (--tensors tensors, --size bytes of fp32 per
// buffer set in total: buffers fp32, exp_avg and exp_avg_sq, split unevenly over --ranks rank files)
// is (a) saved through the storage layer (begin_save, ShardWriter::append in --piece pieces,
// finish, write_metadata, commit_save: fsync'd, renamed) and loaded (CheckpointReader::read of every
// tensor of every buffer into memory), and (b) written with plain sequential write() into the same
// number of files in --piece pieces, fsync'd, and read back with read(), each file front to back,
// every byte into the same address as the load puts it (--dest: each tensor in memory of its own
// at a page + 16 bytes, or all packed end to end; where the bytes land within a page sets the speed
// of the kernel's copy, Note [Page phase] in checkpoint/format.h). Both in the same directory,
// back to back in each of --reps rounds, after --warmup uncounted rounds. Ratio = the median over rounds of plain time / ours in that
// round (target >= 0.8, compression off): on a shared machine whose load drifts, a round's pair sees
// the same load, where medians of each side taken apart mix rounds. GB/s are medians. Then the same
// save with zstd (--zstd 0 skips it): ratio (raw / stored bytes) and GB/s of save and load.
// GB/s = 1e9 bytes / s. Also the same ratios of process CPU time (user + system, which includes the
// kernel's copies to and from the page cache): the work each side does, which a machine shared with
// other jobs changes far less than it changes wall time.
// Values are N(0, 0.02) floats, like weights: they compress little, which is the honest case.
//
//   checkpoint_bench [--size 1G] [--ranks 4] [--tensors 64] [--piece 64M] [--reps 3] [--checksum 1]
//                    [--zstd 1] [--zstd-level 3] [--chunk 0 (auto)] [--dest tensor|packed] [--warmup 1]
//                    [--verbose 0] [--hash-threads 2 (1 on one CPU)] [--dir DIR] [--json FILE]
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "benchmarks/support/bench_args.h"
#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "checkpoint/checkpoint.h"

namespace {

namespace fs = std::filesystem;
namespace ck = zs::checkpoint;
using zs::bench::now_seconds;

double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Setup {
  ck::Metadata meta;
  std::vector<float> values;  // every buffer's elements of every rank, in file order
};

Setup make_setup(size_t bytes, int ranks, int tensors) {
  Setup s;
  s.meta.run_id = ck::new_run_id();
  s.meta.layout.world_size = ranks;
  const uint64_t per_buffer = bytes / 3 / sizeof(float);
  std::mt19937 rng(7);
  for (int t = 0; t < tensors; ++t) {
    uint64_t n = per_buffer / tensors + (t == 0 ? per_buffer % tensors : 0);
    s.meta.layout.tensors.push_back({"layers." + std::to_string(t) + ".w", {n}, zs::memory::DType::kF32});
  }
  std::vector<std::vector<ck::Segment>> segs(static_cast<size_t>(ranks));
  uint64_t flat = 0, weights = static_cast<uint64_t>(ranks) * (ranks + 1) / 2;
  std::vector<uint64_t> cuts{0};
  for (int r = 0, acc = 0; r < ranks; ++r) cuts.push_back(per_buffer * (acc += r + 1) / weights);
  for (uint32_t t = 0; t < s.meta.layout.tensors.size(); ++t) {
    uint64_t n = s.meta.layout.tensors[t].numel();
    for (int r = 0; r < ranks; ++r) {
      uint64_t lo = std::max(flat, cuts[r]), hi = std::min(flat + n, cuts[r + 1]);
      if (lo < hi) segs[r].push_back({t, lo - flat, hi - lo});
    }
    flat += n;
  }
  for (const char* name : {"fp32", "exp_avg", "exp_avg_sq"}) {
    s.meta.layout.buffers.push_back({name, zs::memory::DType::kF32, segs});
  }
  s.values.resize(per_buffer);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& v : s.values) v = normal(rng);
  return s;
}

// Where a load puts each tensor (the same for ours and the plain baseline, Note [Page phase] in
// checkpoint/format.h): "tensor", each tensor in memory of its own at a page + 16 bytes,
// where malloc puts a large allocation (a tensor's own buffer, the engine's staging piece); "packed",
// the tensors end to end from a page + 16 bytes (one flat buffer of the whole model, no padding).
struct Destination {
  std::vector<float> storage;
  float* base = nullptr;
  std::vector<uint64_t> at;  // per tensor: its element 0 is base[at[t]]

  Destination(const ck::Layout& layout, bool packed) {
    uint64_t n = 0;
    for (const auto& t : layout.tensors) {
      if (!packed) n = (n + 1023) / 1024 * 1024;
      at.push_back(n);
      n += t.numel();
    }
    storage.resize(n + 2048);
    auto addr = reinterpret_cast<uintptr_t>(storage.data());
    base = storage.data() + ((addr + 4095) / 4096 * 4096 + 16 - addr) / sizeof(float);
  }
  float* tensor(uint32_t t) { return base + at[t]; }
};

// Rank r's slice of the flat values (the same for each buffer).
std::span<const std::byte> rank_bytes(const Setup& s, int r) {
  uint64_t off = 0;
  for (int q = 0; q < r; ++q) off += s.meta.layout.buffers[0].rank_elements(q);
  return std::as_bytes(std::span<const float>(s.values).subspan(off, s.meta.layout.buffers[0].rank_elements(r)));
}

// Where our save's time goes (--verbose): the rank files' data (creation and appends), their
// finish (checksum tables, flush, fsync), the metadata file, the commit (fsyncs, renames, `latest`).
struct SavePhases {
  double data = 0, finish = 0, metadata = 0, commit = 0;
};

double save_ours(const Setup& s, const fs::path& root, const std::string& tag, const ck::WriteOptions& opt,
                 size_t piece, SavePhases* phases = nullptr) {
  fs::remove_all(root);
  ck::Metadata meta = s.meta;
  meta.tag = tag;
  SavePhases p;
  double t0 = now_seconds();
  fs::path dir = ck::begin_save(root, tag);
  for (int r = 0; r < meta.layout.world_size; ++r) {
    double a = now_seconds();
    ck::ShardWriter w(dir, meta, r, opt);
    auto bytes = rank_bytes(s, r);
    for (const auto& b : meta.layout.buffers) {
      for (size_t off = 0; off < bytes.size(); off += piece) w.append(b.name, bytes.subspan(off, std::min(piece, bytes.size() - off)));
    }
    double f = now_seconds();
    w.finish();
    p.data += f - a;
    p.finish += now_seconds() - f;
  }
  double m = now_seconds();
  ck::write_metadata(dir, meta);
  double c = now_seconds();
  ck::commit_save(root, tag, 0);
  double end = now_seconds();
  p.metadata = c - m;
  p.commit = end - c;
  if (phases != nullptr) *phases = p;
  return end - t0;
}

double load_ours(const fs::path& root, Destination& out, size_t piece) {
  double t0 = now_seconds();
  ck::CheckpointReader r(root);
  const size_t step = piece / sizeof(float);
  const auto& tensors = r.metadata().layout.tensors;
  for (const auto& b : r.metadata().layout.buffers) {
    for (uint32_t t = 0; t < tensors.size(); ++t) {
      for (uint64_t e = 0; e < tensors[t].numel(); e += step) {
        uint64_t n = std::min<uint64_t>(step, tensors[t].numel() - e);
        r.read(b.name, tensors[t].name, e, n, zs::memory::DType::kF32, out.tensor(t) + e);
      }
    }
  }
  return now_seconds() - t0;
}

double save_plain(const Setup& s, const fs::path& dir, size_t piece) {
  fs::remove_all(dir);
  double t0 = now_seconds();
  fs::create_directories(dir);
  for (int r = 0; r < s.meta.layout.world_size; ++r) {
    fs::path p = dir / ("rank" + std::to_string(r));
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ZS_SYS_CHECK(fd, "open of '{}'", p.string());
    auto bytes = rank_bytes(s, r);
    for (int b = 0; b < 3; ++b) {
      for (size_t off = 0; off < bytes.size(); off += piece) {
        ZS_SYS_CHECK(::write(fd, bytes.data() + off, std::min(piece, bytes.size() - off)), "write");
      }
    }
    ZS_SYS_CHECK(::fsync(fd), "fsync");
    ::close(fd);
  }
  ck::fsync_path(dir);
  return now_seconds() - t0;
}

// The same bytes with read(), each rank file front to back, each segment into the same place as
// the load puts it (a read per segment or per piece of it).
double load_plain(const Setup& s, const fs::path& dir, Destination& out, size_t piece) {
  double t0 = now_seconds();
  for (int r = 0; r < s.meta.layout.world_size; ++r) {
    fs::path p = dir / ("rank" + std::to_string(r));
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    ZS_SYS_CHECK(fd, "open of '{}'", p.string());
    for (const auto& b : s.meta.layout.buffers) {
      for (const ck::Segment& seg : b.ranks[static_cast<size_t>(r)]) {
        auto* dst = reinterpret_cast<std::byte*>(out.tensor(seg.tensor) + seg.begin);
        const size_t n = seg.count * sizeof(float);
        for (size_t off = 0; off < n;) {
          ssize_t got = ::read(fd, dst + off, std::min(piece, n - off));
          ZS_SYS_CHECK(got, "read of '{}'", p.string());
          if (got == 0) throw zs::IoError("short read of " + p.string());
          off += static_cast<size_t>(got);
        }
      }
    }
    ::close(fd);
  }
  return now_seconds() - t0;
}

}  // namespace

int main(int argc, char** argv) try {
  const size_t size = zs::bench::parse_size(zs::bench::arg_value(argc, argv, "--size", "1G"));
  const int ranks = static_cast<int>(zs::bench::int_arg(argc, argv, "--ranks", 4));
  const int tensors = static_cast<int>(zs::bench::int_arg(argc, argv, "--tensors", 64));
  const size_t piece = zs::bench::parse_size(zs::bench::arg_value(argc, argv, "--piece", "64M"));
  const int reps = static_cast<int>(zs::bench::int_arg(argc, argv, "--reps", 3));
  const bool checksum = zs::bench::int_arg(argc, argv, "--checksum", 1, 0) != 0;
  const int level = static_cast<int>(zs::bench::int_arg(argc, argv, "--zstd-level", 3));
  const bool with_zstd = zs::bench::int_arg(argc, argv, "--zstd", 1, 0) != 0;
  const size_t chunk = zs::bench::parse_size(zs::bench::arg_value(argc, argv, "--chunk", "0"));
  const fs::path base = zs::bench::arg_value(argc, argv, "--dir", fs::path(argv[0]).parent_path().string());
  const fs::path work = base / "checkpoint_bench.tmp";
  const bool verbose = zs::bench::int_arg(argc, argv, "--verbose", 0, 0) != 0;

  Setup s = make_setup(size, ranks, tensors);
  const double bytes = 3.0 * static_cast<double>(s.values.size()) * sizeof(float);
  const std::string dest = zs::bench::arg_value(argc, argv, "--dest", "tensor");
  if (dest != "tensor" && dest != "packed") throw zs::UsageError("--dest is tensor or packed, not '" + dest + "'");
  const int warmup = static_cast<int>(zs::bench::int_arg(argc, argv, "--warmup", 1, 0));
  Destination out(s.meta.layout, dest == "packed");
  // As a synchronous save of a one-rank run on this machine hashes (the engine passes its compute threads).
  const int hash_threads = static_cast<int>(
      zs::bench::int_arg(argc, argv, "--hash-threads", std::thread::hardware_concurrency() > 1 ? 2 : 1, 1));
  ck::WriteOptions plain_opt{
      .compression = ck::Compression::kNone, .checksum = checksum, .chunk_bytes = chunk, .hash_threads = hash_threads};
  std::vector<double> ours_save, ours_load, raw_save, raw_load, save_ratio, load_ratio, save_cpu, load_cpu;
  // Warm-up rounds, not counted: the first touches of fresh memory in this VM cost several times
  // a steady round's (the first plain load ran 5-8x slower than later ones), and fell on the plain
  // side, which runs first.
  for (int i = 0; i < warmup; ++i) {
    save_plain(s, work / "raw", piece);
    load_plain(s, work / "raw", out, piece);
    fs::remove_all(work / "raw");
    save_ours(s, work / "ours", "global_step1", plain_opt, piece);
    load_ours(work / "ours", out, piece);
  }
  for (int i = 0; i < reps; ++i) {
    double c0 = cpu_seconds();
    raw_save.push_back(save_plain(s, work / "raw", piece));
    double c1 = cpu_seconds();
    raw_load.push_back(load_plain(s, work / "raw", out, piece));
    double c2 = cpu_seconds();
    fs::remove_all(work / "raw");
    double c3 = cpu_seconds();
    SavePhases phases;
    ours_save.push_back(save_ours(s, work / "ours", "global_step1", plain_opt, piece, &phases));
    double c4 = cpu_seconds();
    ours_load.push_back(load_ours(work / "ours", out, piece));
    double c5 = cpu_seconds();
    save_ratio.push_back(raw_save.back() / ours_save.back());
    load_ratio.push_back(raw_load.back() / ours_load.back());
    save_cpu.push_back((c1 - c0) / (c4 - c3));
    load_cpu.push_back((c2 - c1) / (c5 - c4));
    if (verbose) {
      std::fprintf(stderr, "round %d: save plain %.3f ours %.3f s, load plain %.3f ours %.3f s\n", i, raw_save.back(),
                   ours_save.back(), raw_load.back(), ours_load.back());
      std::fprintf(stderr, "  our save: data %.3f s, finish %.3f, metadata %.3f, commit %.3f\n", phases.data,
                   phases.finish, phases.metadata, phases.commit);
    }
  }
  uint64_t flat = 0;
  for (uint32_t t = 0; t < s.meta.layout.tensors.size(); ++t) {
    const uint64_t n = s.meta.layout.tensors[t].numel();
    if (std::memcmp(out.tensor(t), s.values.data() + flat, n * sizeof(float)) != 0) {
      throw zs::InternalError("checkpoint_bench: the loaded exp_avg_sq differs from the saved values");
    }
    flat += n;
  }
  fs::remove_all(work / "ours");
  ck::WriteOptions z_opt{
      .compression = ck::Compression::kZstd, .zstd_level = level, .checksum = checksum, .chunk_bytes = chunk};
  double z_save = 0, z_load = 0, z_stored = 1;
  if (with_zstd) {
    z_save = save_ours(s, work / "zstd", "global_step1", z_opt, piece);
    z_load = load_ours(work / "zstd", out, piece);
    z_stored = static_cast<double>(ck::CheckpointReader(work / "zstd").stored_bytes());
  }
  fs::remove_all(work);

  auto gbps = [&](double t) { return bytes / t / 1e9; };
  double rs = zs::bench::median(raw_save), rl = zs::bench::median(raw_load);
  double os = zs::bench::median(ours_save), ol = zs::bench::median(ours_load);
  std::printf("checkpoint_bench: %.2f GiB in %d rank files, %d tensors x 3 buffers, piece %zu MiB, checksum %s, "
              "destination %s\n",
              bytes / (1 << 30), ranks, tensors, piece >> 20, checksum ? "on" : "off", dest.c_str());
  std::printf("  %-22s %8s %8s\n", "", "save", "load");
  std::printf("  %-22s %6.2f GB/s %6.2f GB/s\n", "plain write()/read()", gbps(rs), gbps(rl));
  std::printf("  %-22s %6.2f GB/s %6.2f GB/s\n", "checkpoint (no zstd)", gbps(os), gbps(ol));
  const double sr = zs::bench::median(save_ratio), lr = zs::bench::median(load_ratio);
  std::printf("  %-22s %8.2fx %8.2fx   (median of per-round ratios; target >= 0.8x)\n", "ratio plain/ours time", sr,
              lr);
  const double sc = zs::bench::median(save_cpu), lc = zs::bench::median(load_cpu);
  std::printf("  %-22s %8.2fx %8.2fx   (process CPU time, user + system)\n", "ratio plain/ours cpu", sc, lc);
  if (with_zstd) {
    std::printf("  zstd level %d: ratio %.3f (raw/stored), save %.2f GB/s, load %.2f GB/s\n", level, bytes / z_stored,
                gbps(z_save), gbps(z_load));
  }

  std::string json = zs::bench::json_path_arg(argc, argv);
  if (!json.empty()) {
    zs::bench::Report r;
    r.benchmark = "checkpoint_bench";
    r.config = {{"bytes", bytes}, {"ranks", ranks}, {"tensors", tensors}, {"piece_bytes", piece},
                {"reps", reps}, {"warmup", warmup}, {"dest", dest}, {"checksum", checksum}, {"zstd_level", level}, {"chunk_bytes", chunk}};
    r.baseline = {{"save_gbps", gbps(rs)}, {"load_gbps", gbps(rl)}};
    r.results.push_back({{"name", "checkpoint"}, {"save_gbps", gbps(os)}, {"load_gbps", gbps(ol)}});
    if (with_zstd) {
      r.results.push_back({{"name", "checkpoint_zstd"}, {"save_gbps", gbps(z_save)}, {"load_gbps", gbps(z_load)},
                           {"compression_ratio", bytes / z_stored}});
    }
    r.ratio = {{"save", sr},           {"load", lr},           {"save_of_medians", rs / os},
               {"load_of_medians", rl / ol}, {"save_cpu", sc}, {"load_cpu", lc}};
    r.write(json);
  }
  return 0;
} catch (const zs::Error& e) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
  return 1;
}
