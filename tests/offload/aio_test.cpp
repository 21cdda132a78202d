// AsyncFile: round trips at odd sizes and offsets under every aio setting, alignment errors, end of
// file, injected short transfers and failures (through the real completion path), real ENOSPC on a
// tiny tmpfs, and the O_DIRECT fallback (at open on ramfs, at the first transfer by injection).
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "offload/aio.h"
#include "offload/detail/fs_info.h"
#include "tests/offload/offload_test_util.h"

namespace zs::offload {
namespace {

using test::pattern;
using test::io_error;
using test::TempDir;

// Enter the private mount namespace before any thread exists (see offload_test_util.h).
const bool kMountNs = test::private_mount_namespace();

// The file's bytes through a plain read, independent of AsyncFile.
std::vector<std::byte> file_bytes(const std::string& path, uint64_t offset, size_t n) {
  std::vector<std::byte> out(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pread(fd, out.data(), n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  ::close(fd);
  return out;
}

AioConfig small_blocks() {
  AioConfig c;
  c.block_size = 64 << 10;
  c.queue_depth = 4;
  return c;
}

TEST(AioConfig, ValidateNamesTheKey) {
  EXPECT_NO_THROW(validate(AioConfig{}, "aio"));
  auto msg = [](AioConfig c) {
    try {
      validate(c, "aio");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  AioConfig c;
  c.block_size = 1000;
  EXPECT_HAS(msg(c), "aio.block_size");
  EXPECT_HAS(msg(c), "1000");
  c = {};
  c.block_size = size_t{2} << 30;
  EXPECT_HAS(msg(c), "aio.block_size");
  c = {};
  c.queue_depth = 0;
  EXPECT_HAS(msg(c), "aio.queue_depth");
  c = {};
  c.thread_count = 0;
  EXPECT_HAS(msg(c), "aio.thread_count");
  EXPECT_HAS(msg(c), "intra_op_parallelism");
}

TEST(AsyncFile, RoundTripOddSizesEverySetting) {
  TempDir dir;
  const std::vector<size_t> sizes = {1, 100, 4095, 4096, 4097, 65536, 65536 + 123, 3 * 65536 + 4096 + 777};
  int variant = 0;
  for (int threads : {1, 3}) {
    for (bool single : {false, true}) {
      for (bool overlap : {true, false}) {
        AioConfig cfg = small_blocks();
        cfg.thread_count = threads;
        cfg.single_submit = single;
        cfg.overlap_events = overlap;
        const std::string path = dir.file("rt" + std::to_string(variant));
        AsyncFile f(path, cfg, OpenMode::kCreate);
        EXPECT_EQ(f.direct(), test::supports_direct(dir.path()));
        AlignedBuffer src(1 << 20), dst(1 << 20);
        uint64_t offset = 0;
        std::vector<Ticket> writes;
        std::vector<std::pair<uint64_t, size_t>> placed;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const auto p = pattern(sizes[i], 100 * variant + i);
          std::byte* at = src.data() + offset;
          std::memcpy(at, p.data(), p.size());
          writes.push_back(f.write_async(offset, std::span<const std::byte>(at, p.size())));
          placed.emplace_back(offset, sizes[i]);
          offset += io_align_up(sizes[i]);
        }
        for (Ticket t : writes) f.wait(t);
        std::vector<Ticket> reads;
        for (auto [off, n] : placed) reads.push_back(f.read_async(off, std::span<std::byte>(dst.data() + off, n)));
        std::reverse(reads.begin(), reads.end());  // wait out of order
        for (Ticket t : reads) f.wait(t);
        for (size_t i = 0; i < placed.size(); ++i) {
          auto [off, n] = placed[i];
          ASSERT_EQ(std::memcmp(dst.data() + off, src.data() + off, n), 0) << "size " << n << " variant " << variant;
          ASSERT_EQ(file_bytes(path, off, n), std::vector<std::byte>(src.data() + off, src.data() + off + n));
        }
        const AioStats s = f.stats();
        EXPECT_EQ(s.requests, 2 * sizes.size());
        EXPECT_GT(s.buffered_submissions, 0u) << "tails shorter than 4096 go through the buffered descriptor";
        EXPECT_LT(s.buffered_submissions, s.submissions);
        EXPECT_EQ(f.requests_in_flight(), 0u);
        ++variant;
      }
    }
  }
}

TEST(AsyncFile, MisalignedRequestsAreRefusedClearly) {
  TempDir dir;
  AsyncFile f(dir.file("mis"), AioConfig{}, OpenMode::kCreate);
  AlignedBuffer buf(3 * 4096);
  std::string m = io_error([&] { f.write_async(100, std::span<const std::byte>(buf.data(), 4096)); });
  EXPECT_HAS(m, "misaligned");
  EXPECT_HAS(m, "offset 100");
  EXPECT_HAS(m, dir.file("mis"));
  EXPECT_HAS(m, "4096");
  m = io_error([&] { f.read_async(4096, std::span<std::byte>(buf.data() + 8, 4096)); });
  EXPECT_HAS(m, "buffer address");
  EXPECT_EQ(f.requests_in_flight(), 0u);
  EXPECT_NO_THROW(f.wait_all());
}

TEST(AsyncFile, ReadPastTheEndFailsInsteadOfSpinning) {
  TempDir dir;
  AsyncFile f(dir.file("eof"), small_blocks(), OpenMode::kCreate);
  AlignedBuffer buf(256 << 10);
  f.write(0, buf.prefix(10000));
  const std::string m = io_error([&] { f.read(0, buf.prefix(200000)); });
  EXPECT_HAS(m, "end of the file");
  EXPECT_HAS(m, "(10000 bytes)");
  EXPECT_HAS(m, dir.file("eof"));
}

TEST(AsyncFile, MissingFileAndExclusiveCreate) {
  TempDir dir;
  EXPECT_HAS(io_error([&] { AsyncFile(dir.file("none"), AioConfig{}, OpenMode::kExisting); }), "does not exist");
  { AsyncFile a(dir.file("x"), AioConfig{}, OpenMode::kCreateExclusive); }
  EXPECT_HAS(io_error([&] { AsyncFile(dir.file("x"), AioConfig{}, OpenMode::kCreateExclusive); }),
             "never overwrites");
}

// Short transfers injected in the submission path: the kernel really moves fewer bytes, and the
// normal completion code must resubmit the rest (odd remainders go buffered, aligned ones direct).
TEST(AsyncFile, InjectedShortTransfersKeepDataExact) {
  TempDir dir;
  for (uint64_t every : {1, 2, 3}) {
    for (int threads : {1, 2}) {
      AioConfig cfg = small_blocks();
      cfg.thread_count = threads;
      const std::string path = dir.file("short" + std::to_string(every) + "_" + std::to_string(threads));
      AsyncFile f(path, cfg, OpenMode::kCreate);
      f.set_fault_plan(FaultPlan{.short_every = every, .seed = every * 7 + threads});
      const size_t n = 5 * 65536 + 3 * 4096 + 5;
      const auto p = pattern(n, every);
      AlignedBuffer src(n), dst(n);
      std::memcpy(src.data(), p.data(), n);
      f.write(8192, src.span());
      ASSERT_EQ(file_bytes(path, 8192, n), p);
      f.read(8192, dst.span());
      ASSERT_EQ(std::memcmp(dst.data(), p.data(), n), 0);
      const AioStats s = f.stats();
      EXPECT_GT(s.short_completions, 0u);
      EXPECT_GT(s.injected_faults, 0u);
      EXPECT_EQ(s.bytes_written, n);
      EXPECT_EQ(s.bytes_read, n);
    }
  }
}

TEST(AsyncFile, InjectedErrorNamesFileAndOffsetAndDrains) {
  TempDir dir;
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kRead}) {
    for (int threads : {1, 3}) {
      AioConfig cfg = small_blocks();
      cfg.thread_count = threads;
      const std::string path = dir.file("eio" + std::to_string(threads));
      AsyncFile f(path, cfg, OpenMode::kCreate);
      AlignedBuffer buf(1 << 20);
      f.write(0, buf.span());  // the file exists and has its size before reads are tested
      f.set_fault_plan(FaultPlan{.fail_nth = 5, .fail_errno = EIO, .fail_op = op});
      // 16 blocks in one request plus a second request: the 5th block fails, the rest drains.
      Ticket big = op == FaultOp::kWrite ? f.write_async(0, buf.span()) : f.read_async(0, buf.span());
      Ticket other = f.read_async(0, buf.prefix(4096));
      const std::string m = io_error([&] { f.wait(big); });
      EXPECT_HAS(m, path);
      EXPECT_HAS(m, "at offset");
      EXPECT_HAS(m, "65536 bytes");
      EXPECT_HAS(m, "Input/output error");
      EXPECT_HAS(m, "1048576-byte");
      EXPECT_NO_THROW(f.wait(other)) << "only the failed request fails";
      EXPECT_EQ(f.requests_in_flight(), 0u);
      // The file stays usable.
      f.set_fault_plan(FaultPlan{});
      EXPECT_NO_THROW(f.write(0, buf.span()));
    }
  }
}

TEST(AsyncFile, WaitAllReportsFailuresAndConsumesTickets) {
  TempDir dir;
  AsyncFile f(dir.file("all"), small_blocks(), OpenMode::kCreate);
  AlignedBuffer buf(512 << 10);
  f.set_fault_plan(FaultPlan{.fail_nth = 2, .fail_errno = EIO});
  f.write_async(0, buf.span());
  f.write_async(0, buf.prefix(4096));
  EXPECT_HAS(io_error([&] { f.wait_all(); }), "Input/output error");
  EXPECT_EQ(f.requests_in_flight(), 0u);
}

TEST(AsyncFile, InjectedEnospcSaysHowToFixIt) {
  TempDir dir;
  AsyncFile f(dir.file("full"), small_blocks(), OpenMode::kCreate);
  AlignedBuffer buf(256 << 10);
  f.set_fault_plan(FaultPlan{.fail_nth = 1, .fail_errno = ENOSPC});
  const std::string m = io_error([&] { f.write(0, buf.span()); });
  EXPECT_HAS(m, "No space left");
  EXPECT_HAS(m, dir.path());
  EXPECT_HAS(m, "needs");
  EXPECT_HAS(m, "nvme_path");
}

TEST(AsyncFile, RealEnospcOnATinyTmpfs) {
  test::ScopedMount fs("tmpfs", "size=1m");
  if (!fs.ok()) GTEST_SKIP() << "no tiny tmpfs here (" << fs.why() << "); InjectedEnospcSaysHowToFixIt covers the message";
  AsyncFile f(fs.path() + "/big", small_blocks(), OpenMode::kCreate);
  AlignedBuffer buf(2 << 20);
  const std::string m = io_error([&] { f.write(0, buf.span()); });
  EXPECT_HAS(m, "No space left");
  EXPECT_HAS(m, fs.path());
  EXPECT_HAS(m, "free space there");
  EXPECT_EQ(f.requests_in_flight(), 0u);
}

TEST(AsyncFile, FallbackWhenTheFirstDirectTransferIsRefused) {
  TempDir dir;
  if (!test::supports_direct(dir.path())) GTEST_SKIP() << dir.path() << " refuses O_DIRECT already";
  test::WarningCapture warnings;
  AioConfig cfg = small_blocks();
  cfg.thread_count = 2;
  AsyncFile f(dir.file("fb"), cfg, OpenMode::kCreate);
  EXPECT_TRUE(f.direct());
  f.set_fault_plan(FaultPlan{.refuse_direct = true});
  const size_t n = 300000;
  const auto p = pattern(n, 9);
  AlignedBuffer src(n), dst(n);
  std::memcpy(src.data(), p.data(), n);
  f.write(0, src.span());
  EXPECT_FALSE(f.direct());
  f.read(0, dst.span());
  EXPECT_EQ(std::memcmp(dst.data(), p.data(), n), 0);
  // Only SQEs issued before the first refusal came back went direct; each was reissued buffered.
  const AioStats s = f.stats();
  EXPECT_GE(s.submissions - s.buffered_submissions, 1u);
  EXPECT_LE(s.submissions - s.buffered_submissions, 8u);
  EXPECT_EQ(s.injected_faults, s.submissions - s.buffered_submissions);
  EXPECT_EQ(s.retries, s.injected_faults);
  const auto w = warnings.warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], dir.file("fb"));
  EXPECT_HAS(w[0], detail::fs_type_name(dir.path()));
  EXPECT_HAS(w[0], "falls back to buffered I/O");
  EXPECT_HAS(w[0], "at the first transfer");
}

// A file system that refuses O_DIRECT at open: ramfs in a private mount (or /dev/shm, where tmpfs
// still refuses it, before Linux 6.6).
TEST(AsyncFile, FallbackWhenOpenRefusesODirect) {
  test::ScopedMount ramfs("ramfs", "");
  std::string where;
  if (ramfs.ok()) {
    where = ramfs.path();
  } else {
    const int fd = ::open("/dev/shm/zs-odirect-probe", O_CREAT | O_RDWR | O_DIRECT, 0600);
    const bool refused = fd < 0 && errno == EINVAL;
    if (fd >= 0) ::close(fd);
    ::unlink("/dev/shm/zs-odirect-probe");
    if (!refused) {
      GTEST_SKIP() << "no file system here refuses O_DIRECT: ramfs cannot be mounted (" << ramfs.why()
                   << ") and /dev/shm (" << detail::fs_type_name("/dev/shm")
                   << ") accepts O_DIRECT (tmpfs does since Linux 6.6)";
    }
    where = "/dev/shm";
  }
  TempDir holder(where);
  test::WarningCapture warnings;
  const std::string path = holder.file("fallback.bin");
  AsyncFile f(path, small_blocks(), OpenMode::kCreateExclusive);
  EXPECT_FALSE(f.direct());
  const size_t n = 200000;
  const auto p = pattern(n, 3);
  AlignedBuffer src(n), dst(n);
  std::memcpy(src.data(), p.data(), n);
  f.write(4096, src.span());
  f.read(4096, dst.span());
  EXPECT_EQ(std::memcmp(dst.data(), p.data(), n), 0);
  EXPECT_EQ(f.stats().submissions, f.stats().buffered_submissions);
  const auto w = warnings.warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], path);
  EXPECT_HAS(w[0], ramfs.ok() ? "ramfs" : "tmpfs");
  EXPECT_HAS(w[0], "at open");
  EXPECT_HAS(w[0], "falls back to buffered I/O");
}

TEST(AsyncFile, DestructionWaitsForRequestsInFlight) {
  TempDir dir;
  AlignedBuffer buf(4 << 20);
  {
    AsyncFile f(dir.file("drop"), small_blocks(), OpenMode::kCreate);
    f.write_async(0, buf.span());
    f.read_async(0, buf.prefix(4096));
  }  // must neither hang nor leave the kernel writing into buf
  EXPECT_EQ(std::filesystem::file_size(dir.file("drop")), 4u << 20);
}

// Random requests under random faults against an in-memory model of the file.
TEST(AsyncFile, RandomizedStressAgainstAModel) {
  TempDir dir;
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 6; ++round) {
    AioConfig cfg;
    cfg.block_size = 4096u << (rng() % 5);
    cfg.queue_depth = 1 + static_cast<int>(rng() % 8);
    cfg.thread_count = 1 + static_cast<int>(rng() % 3);
    cfg.single_submit = rng() % 2;
    cfg.overlap_events = rng() % 2;
    const size_t file_bytes_total = 2 << 20;
    const std::string path = dir.file("stress" + std::to_string(round));
    AsyncFile f(path, cfg, OpenMode::kCreate);
    f.set_fault_plan(FaultPlan{.short_every = 1 + rng() % 4, .seed = rng()});
    std::vector<std::byte> model(file_bytes_total, std::byte{0});
    AlignedBuffer init(file_bytes_total);
    f.write(0, init.span());
    AlignedBuffer buf(file_bytes_total);
    for (int batch = 0; batch < 4; ++batch) {
      // Disjoint 64 KiB slots, each written with a random length, then all read back.
      std::vector<size_t> slots(file_bytes_total / 65536);
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = i;
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(12);
      std::vector<Ticket> tickets;
      for (size_t s : slots) {
        const size_t off = s * 65536 + 4096 * (rng() % 4);
        const size_t len = 1 + rng() % (65536 - 4 * 4096);
        const auto p = pattern(len, rng());
        std::memcpy(buf.data() + off, p.data(), len);
        std::memcpy(model.data() + off, p.data(), len);
        tickets.push_back(f.write_async(off, std::span<const std::byte>(buf.data() + off, len)));
      }
      for (Ticket t : tickets) f.wait(t);
      AlignedBuffer back(file_bytes_total);
      f.read(0, back.span());
      ASSERT_EQ(std::memcmp(back.data(), model.data(), file_bytes_total), 0) << "round " << round << " batch " << batch;
    }
    EXPECT_GT(f.stats().short_completions, 0u);
  }
}

}  // namespace
}  // namespace zs::offload
