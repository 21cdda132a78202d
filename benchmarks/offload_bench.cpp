// Question: how close do zeroshard's offload transfers come to the disk? Section 1 (file I/O): the
// sequential write and read bandwidth of (a) one SwapSpace request of the whole size (AsyncFile:
// worker thread, block splitting, completion handling) and (b) a PipelinedSwapper pass over the same
// bytes in sub-groups (write-only pass and read-only pass, trivial compute), against a minimal
// O_DIRECT io_uring loop written here directly on liburing, on the same file (the same extents), with
// the same block size and queue depth, and the same host memory (see raw_pass). Ratio =
// ours / raw; target >= 0.9.
//
// Section 2 (the NVMe vs CPU optimizer offload step time) is added once the engine uses offload: add
// a function like run_file_io_section() and call it from main.
//
// The file is a SwapSpace in --dir (default: this executable's directory, i.e. the build tree; pick a
// directory on the NVMe drive you care about). O_DIRECT bypasses the page cache, so no cache dropping
// is needed; a virtual disk's host may still cache. Each figure is the median of --reps repetitions,
// raw and ours interleaved so both see the same machine load. GB/s = 1e9 bytes per second.
//
//   offload_bench [--sizes 64M,256M,1G] [--dir DIR] [--block-size 1M] [--queue-depth 8]
//                 [--sub-group 32M] [--buffers 3] [--threads 1] [--reps 5] [--json FILE]
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "offload/detail/fs_info.h"
#include "offload/offload.h"

namespace {

using zs::bench::now_seconds;
namespace off = zs::offload;

// "64M,256M,1G" with binary units (K/M/G = 2^10/2^20/2^30).
std::vector<size_t> parse_sizes(const std::string& list, const std::string& flag) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      size_t pos = 0;
      unsigned long long v = 0;
      try {
        v = std::stoull(item, &pos);
      } catch (const std::exception&) {
        throw zs::ConfigError(flag + ": '" + item + "' is not a size; use e.g. 64M,256M,1G");
      }
      const std::string unit = item.substr(pos);
      if (unit == "K") v <<= 10;
      else if (unit == "M") v <<= 20;
      else if (unit == "G") v <<= 30;
      else if (!unit.empty()) throw zs::ConfigError(flag + ": unknown suffix in '" + item + "'; use K, M or G");
      if (v == 0) throw zs::ConfigError(flag + ": sizes must be >= 1, got '" + item + "'");
      out.push_back(v);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw zs::ConfigError(flag + ": expected a comma-separated list such as 64M,256M,1G");
  return out;
}

size_t size_arg(int argc, char** argv, const std::string& flag, const std::string& fallback) {
  const std::vector<size_t> v = parse_sizes(zs::bench::arg_value(argc, argv, flag, fallback), flag);
  if (v.size() != 1) throw zs::ConfigError(flag + ": expected one size");
  return v.front();
}

std::string human(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "G";
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= (size_t{1} << 10) && bytes % (size_t{1} << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

// The baseline: sequential O_DIRECT transfers of `bytes` of the file, `block` bytes per SQE, at most
// `depth` in flight, refilled as completions arrive (one io_uring_submit_and_wait per round). Returns
// seconds. No worker thread, no queue, no bookkeeping beyond a counter. Memory: file bytes
// [k * chunk, (k + 1) * chunk) go to/from bufs[k % bufs.size()]. Each baseline uses the very memory
// its counterpart uses: the whole-size buffer of the SwapSpace request (chunk = bytes), or the
// swapper's own host buffers (chunk = sub-group). That matters on a virtual disk: here, reads into
// one freshly mapped 96 MiB buffer ran 15-25% faster or slower than into another (host-side
// placement of guest memory), which made a baseline with merely the same footprint useless.
double raw_pass(const std::string& path, bool write, const std::vector<std::byte*>& bufs, size_t bytes, size_t block,
                int depth, size_t chunk) {
  const int fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) throw zs::IoError("raw baseline: cannot open '" + path + "' with O_DIRECT: " + std::strerror(errno));
  io_uring ring{};
  if (int rc = io_uring_queue_init(static_cast<unsigned>(depth), &ring, 0); rc < 0) {
    ::close(fd);
    throw zs::IoError(std::string("raw baseline: io_uring_queue_init: ") + std::strerror(-rc));
  }
  const double t0 = now_seconds();
  size_t next = 0, done = 0;
  int in_flight = 0;
  std::string error;
  while (done < bytes && error.empty()) {
    while (in_flight < depth && next < bytes) {
      const size_t len = std::min({block, bytes - next, chunk - next % chunk});
      std::byte* at = bufs[next / chunk % bufs.size()] + next % chunk;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (write) io_uring_prep_write(sqe, fd, at, static_cast<unsigned>(len), next);
      else io_uring_prep_read(sqe, fd, at, static_cast<unsigned>(len), next);
      sqe->user_data = len;
      next += len;
      ++in_flight;
    }
    io_uring_submit_and_wait(&ring, 1);
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      if (cqe->res < 0 || static_cast<uint64_t>(cqe->res) != cqe->user_data) {
        error = cqe->res < 0 ? std::strerror(-cqe->res) : "short transfer";
      } else {
        done += cqe->user_data;
      }
      --in_flight;
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
  }
  while (in_flight > 0) {  // after an error: let the kernel finish with our buffer first
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  }
  const double t1 = now_seconds();
  io_uring_queue_exit(&ring);
  ::close(fd);
  if (!error.empty()) throw zs::IoError("raw baseline on '" + path + "': " + error);
  return t1 - t0;
}

struct Args {
  std::vector<size_t> sizes;
  std::string dir;
  off::AioConfig aio;
  size_t sub_group = 0;
  size_t buffers = 3;
  int reps = 3;
};

double gbps(size_t bytes, double s) { return static_cast<double>(bytes) / s / 1e9; }

// Section 1: file I/O against the raw loop. Appends rows and ratios; returns the lowest ratio.
double run_file_io_section(const Args& a, zs::bench::Report& report, boost::json::object& ratios) {
  std::printf("%-5s %-5s %4s %9s %9s %9s %9s %8s %8s %9s\n", "size", "op", "reps", "raw GB/s", "file GB/s",
              "rawrot GB/s", "swap GB/s", "file/raw", "swap/rot", "swap wait");
  double lowest = 1e9;
  for (size_t bytes : a.sizes) {
    off::SwapSpace space(a.dir, 0, "offload-bench", bytes, a.aio);
    off::SwapRegion region = space.allocate(bytes);
    off::AlignedBuffer buf(bytes);
    std::memset(buf.data(), 0x5a, bytes);  // faults the pages in before timing
    // Sub-groups of one item each, tiling the region; the last may be shorter.
    const size_t sg = std::min(a.sub_group, bytes);
    std::vector<std::vector<off::SwapItem>> wgroups, rgroups;
    for (size_t pos = 0; pos < bytes; pos += sg) {
      const size_t n = std::min(sg, bytes - pos);
      wgroups.push_back({off::SwapItem{.region = region, .offset = pos, .bytes = n, .mode = off::SwapMode::kWriteOnly}});
      rgroups.push_back({off::SwapItem{.region = region, .offset = pos, .bytes = n, .mode = off::SwapMode::kReadOnly}});
    }
    off::PipelinedSwapper wswap(wgroups, {.buffer_count = a.buffers});
    off::PipelinedSwapper rswap(rgroups, {.buffer_count = a.buffers});
    auto trivial = [](size_t g, std::span<std::span<std::byte>> items) {
      items[0][0] = static_cast<std::byte>(g);  // touch the data, as a real step would
    };
    const int block_depth = a.aio.queue_depth * a.aio.thread_count;
    // Warm-up: one pass of each, so extents are written (not unwritten), the rings are hot and every
    // buffer holds data. The fill matters: writing never-touched anonymous memory sends the shared
    // zero page, which a virtual disk may store faster than real data.
    const std::vector<std::byte*> whole = {buf.data()};
    std::vector<std::byte*> wbufs, rbufs;  // the swappers' own host buffers (see raw_pass)
    for (size_t i = 0; i < wswap.buffer_count(); ++i) wbufs.push_back(wswap.host_buffer(i).data());
    for (size_t i = 0; i < rswap.buffer_count(); ++i) rbufs.push_back(rswap.host_buffer(i).data());
    raw_pass(space.path(), true, whole, bytes, a.aio.block_size, block_depth, bytes);
    space.write(region, 0, buf.span());
    wswap.run([](size_t, std::span<std::span<std::byte>> items) { std::memset(items[0].data(), 0x5a, items[0].size()); });
    rswap.run([](size_t, std::span<std::span<std::byte>>) {});
    for (bool write : {true, false}) {
      std::vector<double> t_raw, t_raw_sg, t_file, t_swap;
      double wait_s = 0, run_s = 0;
      for (int r = 0; r < a.reps; ++r) {
        t_raw.push_back(raw_pass(space.path(), write, whole, bytes, a.aio.block_size, block_depth, bytes));
        t_raw_sg.push_back(
            raw_pass(space.path(), write, write ? wbufs : rbufs, bytes, a.aio.block_size, block_depth, sg));
        double t0 = now_seconds();
        if (write) space.write(region, 0, buf.span());
        else space.read(region, 0, buf.span());
        t_file.push_back(now_seconds() - t0);
        off::PipelinedSwapper& sw = write ? wswap : rswap;
        sw.reset_stats();
        sw.run(trivial);
        t_swap.push_back(sw.stats().run_seconds);
        wait_s += sw.stats().io_wait_seconds;
        run_s += sw.stats().run_seconds;
      }
      const double raw = gbps(bytes, zs::bench::median(t_raw)), raw_sg = gbps(bytes, zs::bench::median(t_raw_sg)),
                   file = gbps(bytes, zs::bench::median(t_file)), swap = gbps(bytes, zs::bench::median(t_swap));
      const double r_file = file / raw, r_swap = swap / raw_sg;
      const char* op = write ? "write" : "read";
      std::printf("%-5s %-5s %4d %9.3f %9.3f %9.3f %9.3f %8.3f %8.3f %8.0f%%\n", human(bytes).c_str(), op, a.reps,
                  raw, file, raw_sg, swap, r_file, r_swap, 100.0 * wait_s / run_s);
      boost::json::object row;
      row["section"] = "file_io";
      row["bytes"] = bytes;
      row["op"] = op;
      row["repetitions"] = a.reps;
      row["raw_gbps"] = raw;
      row["raw_rotating_gbps"] = raw_sg;
      row["swap_space_gbps"] = file;
      row["swapper_gbps"] = swap;
      row["swap_space_ratio"] = r_file;
      row["swapper_ratio"] = r_swap;
      row["swapper_io_wait_fraction"] = wait_s / run_s;
      row["swapper_sub_groups"] = wgroups.size();
      row["swapper_host_buffer_bytes"] = wswap.host_buffer_bytes();
      row["direct_io"] = space.file().direct();
      report.results.push_back(std::move(row));
      ratios[human(bytes) + "/" + op + "/swap_space"] = r_file;
      ratios[human(bytes) + "/" + op + "/swapper"] = r_swap;
      lowest = std::min({lowest, r_file, r_swap});
    }
  }
  return lowest;
}

std::string default_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/tmp") : exe.parent_path().string();
}

}  // namespace

int main(int argc, char** argv) try {
  Args a;
  a.sizes = parse_sizes(zs::bench::arg_value(argc, argv, "--sizes", "64M,256M,1G"), "--sizes");
  a.dir = zs::bench::arg_value(argc, argv, "--dir", default_dir());
  a.aio.block_size = size_arg(argc, argv, "--block-size", "1M");
  a.aio.queue_depth = static_cast<int>(std::stol(zs::bench::arg_value(argc, argv, "--queue-depth", "8")));
  a.aio.thread_count = static_cast<int>(std::stol(zs::bench::arg_value(argc, argv, "--threads", "1")));
  off::validate(a.aio, "--block-size/--queue-depth/--threads");
  a.sub_group = off::io_align_up(size_arg(argc, argv, "--sub-group", "32M"));
  a.buffers = static_cast<size_t>(std::stoul(zs::bench::arg_value(argc, argv, "--buffers", "3")));
  a.reps = static_cast<int>(std::stol(zs::bench::arg_value(argc, argv, "--reps", "5")));
  if (a.reps < 1 || a.buffers < 1) throw zs::ConfigError("--reps and --buffers must be >= 1");

  zs::bench::Report report;
  report.benchmark = "offload_bench";
  boost::json::array size_list;
  for (size_t s : a.sizes) size_list.push_back(s);
  report.config["sizes_bytes"] = size_list;
  report.config["dir"] = a.dir;
  report.config["file_system"] = off::detail::fs_type_name(a.dir);
  report.config["block_size"] = a.aio.block_size;
  report.config["queue_depth"] = a.aio.queue_depth;
  report.config["thread_count"] = a.aio.thread_count;
  report.config["sub_group_bytes"] = a.sub_group;
  report.config["buffer_count"] = a.buffers;
  report.config["gbps"] = "1e9 bytes per second, median of repetitions";
  std::printf("offload_bench: dir %s (%s), block %s, queue depth %d, threads %d, sub-group %s, %zu buffers\n",
              a.dir.c_str(), off::detail::fs_type_name(a.dir).c_str(), human(a.aio.block_size).c_str(),
              a.aio.queue_depth, a.aio.thread_count, human(a.sub_group).c_str(), a.buffers);

  boost::json::object ratios;
  const double lowest = run_file_io_section(a, report, ratios);
  ratios["min"] = lowest;
  report.ratio = ratios;
  report.baseline["name"] =
      "raw O_DIRECT io_uring loop on liburing: sequential block_size SQEs, queue_depth * thread_count in flight, "
      "refilled per completion round (io_uring_submit_and_wait), same file and extents, same run; raw_gbps uses one "
      "buffer of the whole size, the one the swap_space request uses; raw_rotating_gbps moves sub-group after "
      "sub-group through the swapper's own host buffers in its rotation (baseline of swapper)";
  std::printf("ratio = ours / raw at the same size, block size and queue depth; lowest %.3f (target >= 0.9); "
              "'swap wait' = share of the swapper's run spent waiting for I/O\n", lowest);
  const std::string json = zs::bench::json_path_arg(argc, argv);
  if (!json.empty()) report.write(json);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "offload_bench: %s\n", e.what());
  return 1;
}
