// Checkpoint storage: round trips at other "world sizes" (re-sliced reads), zstd, keep_last, atomic
// save under SIGKILL, and the refusal of corrupt, truncated, foreign and mismatched files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include <atomic>
#include <fstream>
#include <random>
#include <thread>

#include "core/errors.h"
#include "checkpoint/detail/checksum.h"
#include "checkpoint/detail/direct_read.h"
#include "checkpoint/detail/serialize.h"
#include "checkpoint/h5.h"
#include "memory/cpu_features.h"
#include "tests/checkpoint/synthetic.h"
#include "tests/support/temp_dir.h"

namespace zs::checkpoint {
namespace {

namespace fs = std::filesystem;
using test::synthetic_value;

// Reads every tensor of every buffer, whole and in odd ranges, and checks each element.
void expect_synthetic(CheckpointReader& r) {
  const Layout& layout = r.metadata().layout;
  for (size_t b = 0; b < layout.buffers.size(); ++b) {
    const BufferLayout& bl = layout.buffers[b];
    for (uint32_t t = 0; t < layout.tensors.size(); ++t) {
      const TensorInfo& info = layout.tensors[t];
      std::vector<float> all(info.numel());
      r.read(bl.name, info.name, 0, info.numel(), DType::kF32, all.data());
      for (uint64_t e = 0; e < info.numel(); ++e) {
        const float want = test::synthetic_stored(t, e, static_cast<int>(b), bl.dtype);
        ASSERT_EQ(all[e], want) << bl.name << " " << info.name << " element " << e;
      }
      // A requesting layout of 7 "ranks": ranges that cut across the writer's.
      for (uint64_t lo = 0; lo < info.numel(); lo += 97) {
        uint64_t n = std::min<uint64_t>(97 + lo % 13, info.numel() - lo);
        std::vector<float> part(n);
        r.read(bl.name, info.name, lo, n, DType::kF32, part.data());
        for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(part[i], all[lo + i]);
      }
    }
  }
}

TEST(CheckpointStorage, RoundTripUnevenRanksAnyRequestingLayout) {
  test::TempDir tmp;
  for (int world : {1, 3, 4}) {
    fs::path root = fs::path(tmp.path()) / fmt::format("w{}", world);
    auto meta = test::synthetic_metadata(world, "global_step5", 5);
    test::save_synthetic(root, meta, WriteOptions{.chunk_bytes = 1000});
    EXPECT_EQ(read_latest(root), "global_step5");
    CheckpointReader r(root);
    EXPECT_EQ(r.metadata().run_id, meta.run_id);
    EXPECT_EQ(std::get<int64_t>(r.metadata().scalars.at("global_step")), 5);
    EXPECT_EQ(std::get<double>(r.metadata().scalars.at("loss_scaler.scale")), 65536.0);
    EXPECT_EQ(std::get<std::string>(r.metadata().scalars.at("rng.state")), "seed=42;n=7");
    EXPECT_EQ(r.metadata().config_json, meta.config_json);
    ASSERT_EQ(r.metadata().layout.tensors.size(), meta.layout.tensors.size());
    EXPECT_EQ(r.metadata().layout.tensors[0].shape, (std::vector<uint64_t>{50, 16}));
    EXPECT_TRUE(r.holds("fp32", "ln_f.gain"));
    expect_synthetic(r);
    // bf16 out of an fp32 buffer: converted on the way.
    std::vector<uint16_t> half(48);
    r.read("fp32", "h.0.attn.b", 0, 48, DType::kBF16, half.data());
    EXPECT_EQ(half[5], memory::f32_to_bf16(synthetic_value(2, 5, 1)));
    EXPECT_THROW(r.read("fp32", "nope", 0, 1, DType::kF32, half.data()), UsageError);
    EXPECT_THROW(r.read("fp32", "h.0.attn.b", 40, 9, DType::kF32, half.data()), UsageError);
  }
}

// A tensor-parallel layout: each of 2 ranks holds half of every row of a (40, 24) tensor, so the
// tensor is 80 interleaved segments; every range reads across them (the reader's search for a
// read's first segment).
TEST(CheckpointStorage, ReadsAnyRangeOfInterleavedRowSlices) {
  test::TempDir tmp;
  auto meta = test::synthetic_metadata(2, "t", 1);
  meta.layout.tensors = {{"proj.weight", {40, 24}, DType::kF32}};
  std::vector<std::vector<Segment>> ranks(2);
  for (uint64_t row = 0; row < 40; ++row) {
    for (uint32_t r = 0; r < 2; ++r) ranks[r].push_back(Segment{0, row * 24 + r * 12, 12});
  }
  meta.layout.buffers = {{"fp32", DType::kF32, ranks}};
  test::save_synthetic(tmp.path(), meta);
  CheckpointReader r(tmp.path());
  EXPECT_TRUE(r.holds("fp32", "proj.weight"));
  std::vector<float> got(960);
  for (uint64_t begin : {0, 1, 11, 12, 13, 23, 24, 500, 947, 959}) {
    for (uint64_t count : {1, 5, 12, 13, 30, 200}) {
      if (begin + count > 960) continue;
      r.read("fp32", "proj.weight", begin, count, DType::kF32, got.data());
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[i], synthetic_value(0, begin + i, 0)) << "read [" << begin << ", +" << count << ") at " << i;
      }
    }
  }
}

TEST(CheckpointStorage, PartialBufferCoverageIsReportedByName) {
  test::TempDir tmp;
  auto meta = test::synthetic_metadata(2, "t", 1);
  meta.layout.buffers[2].ranks[1].clear();  // exp_avg: rank 1's part missing from the layout
  test::save_synthetic(tmp.path(), meta);
  CheckpointReader r(tmp.path());
  EXPECT_FALSE(r.holds("exp_avg", "ln_f.gain"));
  float x = 0;
  try {
    r.read("exp_avg", "ln_f.gain", 0, 1, DType::kF32, &x);
    FAIL() << "read of elements no rank holds";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("ln_f.gain"), std::string::npos) << e.what();
  }
}

TEST(CheckpointStorage, ZstdCompressesAndRoundTrips) {
  test::TempDir tmp;
  auto meta = test::synthetic_metadata(2, "z", 1, 64);
  fs::path plain = fs::path(tmp.path()) / "plain", packed = fs::path(tmp.path()) / "zstd";
  test::save_synthetic(plain, meta);
  meta.run_id = new_run_id();
  test::save_synthetic(packed, meta, WriteOptions{.compression = Compression::kZstd, .zstd_level = 3});
  CheckpointReader a(plain), b(packed);
  expect_synthetic(b);
  EXPECT_LT(b.stored_bytes() * 2, a.stored_bytes()) << "the synthetic values repeat every 4096 elements";
}

TEST(CheckpointStorage, KeepLastAndLatest) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  for (int step = 1; step <= 4; ++step) {
    test::save_synthetic(root, test::synthetic_metadata(2, fmt::format("global_step{}", step), step), {}, 2);
  }
  auto tags = list_tags(root);
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "global_step3");
  EXPECT_EQ(tags[1].tag, "global_step4");
  EXPECT_EQ(read_latest(root), "global_step4");
  // Re-saving an existing tag replaces it whole.
  auto again = test::synthetic_metadata(2, "global_step4", 4);
  test::save_synthetic(root, again, {}, 2);
  EXPECT_EQ(CheckpointReader(root).metadata().run_id, again.run_id);
  EXPECT_FALSE(fs::exists(root / "global_step4.replaced"));
  EXPECT_THROW(begin_save(root, "../x"), UsageError);
}

// begin_save clears the staging directories of crashed saves, but not those a background prune is
// still removing (commit_save's remove_later): two removals of one tree race, and the loser failed
// the save with ENOENT (an asynchronous save's commit starts its prune just before the next save's
// begin_save; the e2e async-save resume caught it).
TEST(CheckpointStorage, BeginSaveLeavesAPruneInProgressAlone) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  test::save_synthetic(root, test::synthetic_metadata(2, "global_step1", 1));
  const auto meta = test::synthetic_metadata(2, "global_step2", 2);
  const fs::path dir = begin_save(root, meta.tag);
  for (int r = 0; r < 2; ++r) test::write_synthetic_rank(dir, meta, r, {});
  write_metadata(dir, meta);
  std::vector<fs::path> pruning;
  commit_save(root, meta.tag, 1, &pruning);
  ASSERT_EQ(pruning.size(), 1u);
  ASSERT_TRUE(fs::exists(pruning[0]));
  fs::create_directories(root / ".staging.crashed" / "sub");
  const fs::path staging = begin_save(root, "global_step3", pruning);
  EXPECT_TRUE(fs::exists(pruning[0])) << "the prune's directory is the prune's to remove";
  EXPECT_TRUE(fs::exists(staging));
  EXPECT_FALSE(fs::exists(root / ".staging.crashed")) << "a crashed save's staging directory is cleared";
  begin_save(root, "global_step3");
  EXPECT_FALSE(fs::exists(pruning[0])) << "with no prune running, a pruned directory left behind is cleared";
}

// Pruning (keep_last) must never show part of a tag under its name: a crash inside the removal left
// a tag missing its metadata or rank files (the fault trials caught one). The old tag gets thousands
// of extra files, so removing them takes a while, and this thread watches it while another commits a
// newer tag with keep_last 1: whenever the old tag's name is there before and after a count, all of
// its entries are there.
TEST(CheckpointStorage, PruningNeverShowsPartOfATag) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  test::save_synthetic(root, test::synthetic_metadata(2, "global_step1", 1), {}, 1);
  const fs::path old_tag = root / "global_step1";
  constexpr int kExtra = 5000;
  for (int i = 0; i < kExtra; ++i) std::ofstream(old_tag / fmt::format("extra{}", i));
  const auto count = [&] {
    std::error_code ec;
    size_t n = 0;
    for (fs::directory_iterator it(old_tag, ec), end; !ec && it != end; it.increment(ec)) ++n;
    return n;
  };
  const size_t whole = count();
  std::atomic<bool> done{false};
  std::thread saver([&] {
    test::save_synthetic(root, test::synthetic_metadata(2, "global_step2", 2), {}, 1);
    done = true;
  });
  int looks = 0, partial = 0;
  while (!done) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // leaves the saver a core on 2 cores
    if (!fs::exists(old_tag)) continue;
    size_t n = count();
    if (!fs::exists(old_tag)) continue;  // renamed away during the count: inconclusive
    ++looks;
    if (n != whole) ++partial;
  }
  saver.join();
  EXPECT_EQ(partial, 0) << looks << " looks at the tag being pruned, " << whole << " entries when whole";
  EXPECT_FALSE(fs::exists(old_tag));
  EXPECT_EQ(read_latest(root), "global_step2");
  for (const auto& e : fs::directory_iterator(root)) {
    EXPECT_NE(e.path().filename().string().rfind(".staging.", 0), 0u) << e.path() << " left behind";
  }
}

// Note [Crash test]: a child process saves tag B over a root whose latest is tag A and is SIGKILLed
// after a random delay within the save's measured duration; the parent then loads A (always) and
// `latest` (A or B, whichever it names, complete either way).
TEST(CheckpointStorage, SigkillDuringSaveLeavesPreviousTagLoadable) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  auto a = test::synthetic_metadata(3, "global_step10", 10, 16);
  test::save_synthetic(root, a);
  auto t0 = std::chrono::steady_clock::now();
  test::save_synthetic(root, test::synthetic_metadata(3, "probe", 0, 16));
  auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  fs::remove_all(root / "probe");
  std::ofstream(root / "latest", std::ios::trunc) << "global_step10";
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    auto b = test::synthetic_metadata(3, "global_step20", 20, 16);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        test::save_synthetic(root, b);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    ::usleep(static_cast<useconds_t>(std::uniform_int_distribution<int64_t>(0, save_us * 12 / 10)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    CheckpointReader prev(root, "global_step10");
    EXPECT_EQ(prev.metadata().run_id, a.run_id) << "trial " << trial;
    std::string latest = read_latest(root);
    EXPECT_TRUE(latest == "global_step10" || latest == "global_step20") << latest;
    CheckpointReader last(root);
    expect_synthetic(last);
    fs::remove_all(root / "global_step20");
    fs::remove_all(root / "global_step20.replaced");
    std::ofstream(root / "latest", std::ios::trunc) << "global_step10";
  }
}

// --- corrupt, truncated, foreign and mismatched files --------------------------------------------

std::string open_error(const fs::path& root) {
  try {
    CheckpointReader r(root);
    expect_synthetic(r);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x5a));
}

uint64_t find_bytes(const fs::path& file, const std::string& needle) {
  std::ifstream in(file, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto pos = data.find(needle);
  EXPECT_NE(pos, std::string::npos) << needle;
  return pos;
}

class CheckpointCorrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    meta_ = test::synthetic_metadata(3, "global_step7", 7, 8);
    test::save_synthetic(root_, meta_, WriteOptions{.chunk_bytes = 512});
    ASSERT_EQ(open_error(root_), "");
  }
  fs::path rank_file(int r) const { return root_ / "global_step7" / rank_file_name(r); }
  fs::path meta_file() const { return root_ / "global_step7" / kMetadataFile; }
  void expect_error(const std::string& file_part, const std::string& what) {
    std::string err = open_error(root_);
    EXPECT_NE(err.find(file_part), std::string::npos) << err;
    EXPECT_NE(err.find(what), std::string::npos) << err;
  }
  test::TempDir tmp_;
  fs::path root_ = tmp_.path();
  Metadata meta_;
};

TEST_F(CheckpointCorrupt, BadVersion) {
  auto newer = meta_;
  newer.version = kFormatVersion + 1;
  newer.tag = "vnext";
  test::save_synthetic(root_, newer);
  expect_error(kMetadataFile, fmt::format("format version {}, this zeroshard reads versions 1 to {}",
                                          kFormatVersion + 1, kFormatVersion));
}

TEST_F(CheckpointCorrupt, MissingRankFile) {
  fs::remove(rank_file(1));
  expect_error(rank_file_name(1), "missing");
}

TEST_F(CheckpointCorrupt, ShardOfAnotherRun) {
  auto other = meta_;
  other.run_id = new_run_id();
  other.tag = "other";
  test::save_synthetic(fs::path(tmp_.path()) / "elsewhere", other);
  fs::copy_file(fs::path(tmp_.path()) / "elsewhere" / "other" / rank_file_name(2), rank_file(2),
                fs::copy_options::overwrite_existing);
  expect_error(rank_file_name(2), "another save");
}

TEST_F(CheckpointCorrupt, ShardOfAnotherLayout) {
  auto other = test::synthetic_metadata(3, "global_step7", 7, 9);  // other shapes, same run id
  other.run_id = meta_.run_id;
  test::save_synthetic(fs::path(tmp_.path()) / "elsewhere", other);
  fs::copy_file(fs::path(tmp_.path()) / "elsewhere" / "global_step7" / rank_file_name(0), rank_file(0),
                fs::copy_options::overwrite_existing);
  expect_error(rank_file_name(0), "does not match");
}

TEST_F(CheckpointCorrupt, TruncatedRankFile) {
  fs::resize_file(rank_file(1), fs::file_size(rank_file(1)) / 2);
  expect_error(rank_file_name(1), "");
}

TEST_F(CheckpointCorrupt, TruncatedMetadata) {
  fs::resize_file(meta_file(), 100);
  expect_error(kMetadataFile, "");
}

// The file offset of the chunk of /buffers/<buffer>/data holding element `element`.
uint64_t chunk_address(const fs::path& file, const std::string& buffer, uint64_t element) {
  h5::Handle f = h5::file_open(file);
  h5::Handle ds = h5::dataset_open(f.get(), ("buffers/" + buffer + "/data").c_str(), file);
  h5::Handle dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
  hsize_t chunk = 0;
  H5Pget_chunk(dcpl.get(), 1, &chunk);
  hsize_t coord = element / chunk * chunk, size = 0;
  haddr_t addr = 0;
  unsigned mask = 0;
  EXPECT_GE(H5Dget_chunk_info_by_coord(ds.get(), &coord, &mask, &addr, &size), 0);
  return addr;
}

TEST_F(CheckpointCorrupt, FlippedDataBytesFailTheChecksum) {
  flip_byte(rank_file(2), chunk_address(rank_file(2), "exp_avg", 1000) + 5);
  expect_error(rank_file_name(2), "fails its xxh3-64 checksum");
}

// Note [Checksum blocks]: whichever way a read touches a corrupt block (whole blocks straight into
// the caller's memory, a partial block through the reader's one-block cache, with or without dtype
// conversion, under zstd) it fails; reads that do not touch it succeed.
TEST(CheckpointChecksum, EveryReadTouchingACorruptChunkFails) {
  for (Compression compression : {Compression::kNone, Compression::kZstd}) {
    test::TempDir tmp;
    fs::path root = tmp.path();
    auto meta = test::synthetic_metadata(1, "global_step1", 1, 8);
    test::save_synthetic(root, meta, WriteOptions{.compression = compression, .chunk_bytes = 256});  // 64 fp32 blocks
    fs::path file = root / "global_step1" / rank_file_name(0);
    // embed.weight is tensor 0 and first in the data: its element e is data element e.
    flip_byte(file, chunk_address(file, "fp32", 640) + (compression == Compression::kNone ? 17 : 0));
    CheckpointReader r(root);
    std::vector<float> out(1000);
    auto fails = [&](const char* buffer, uint64_t begin, uint64_t count, DType dtype) {
      try {
        r.read(buffer, "embed.weight", begin, count, dtype, out.data());
      } catch (const CheckpointError& e) {
        return std::string(e.what()).find(rank_file_name(0)) != std::string::npos;
      }
      return false;
    };
    EXPECT_TRUE(fails("fp32", 0, 1000, DType::kF32));    // whole chunks
    EXPECT_TRUE(fails("fp32", 650, 3, DType::kF32));     // inside the chunk
    EXPECT_TRUE(fails("fp32", 600, 100, DType::kBF16));  // converted
    EXPECT_FALSE(fails("fp32", 0, 640, DType::kF32));    // the chunks before it
    EXPECT_FALSE(fails("fp32", 704, 200, DType::kF32));  // after it
    EXPECT_FALSE(fails("exp_avg", 0, 1000, DType::kF32));
  }
}

// With the default 4 MiB chunks a checksum covers a 64 KiB block: a flipped byte fails the reads of
// its block only, and a small read next to it reads no more than its own blocks.
TEST(CheckpointChecksum, BlocksInsideLargeChunks) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  auto meta = test::synthetic_metadata(1, "global_step1", 1, 200);  // embed.weight: 160000 fp32
  test::save_synthetic(root, meta);
  fs::path file = root / "global_step1" / rank_file_name(0);
  {
    h5::Handle f = h5::file_open(file);
    h5::Handle t = h5::dataset_open(f.get(), "buffers/fp32/checksums", file);
    ASSERT_EQ(h5::read_attr_int(t.get(), "block_elements", file), 16384);
  }
  // Element 40000 is in block 2 ([32768, 49152)).
  flip_byte(file, chunk_address(file, "fp32", 0) + 40000 * 4 + 1);
  CheckpointReader r(root);
  std::vector<float> out(160000);
  auto fails = [&](uint64_t begin, uint64_t count) {
    try {
      r.read("fp32", "embed.weight", begin, count, DType::kF32, out.data());
    } catch (const CheckpointError& e) {
      return std::string(e.what()).find("block 2 ") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(fails(0, 160000));
  EXPECT_TRUE(fails(39990, 20));
  EXPECT_TRUE(fails(49151, 1));
  EXPECT_FALSE(fails(0, 32768));
  EXPECT_FALSE(fails(49152, 100000));
  EXPECT_FALSE(fails(20000, 12000));
  r.read("fp32", "embed.weight", 100000, 50, DType::kF32, out.data());
  for (uint64_t e = 0; e < 50; ++e) EXPECT_EQ(out[e], test::synthetic_value(0, 100000 + e, 1));
}

TEST(CheckpointChecksum, TableMatchesXxh3OfEachBlockAndItsLossIsRefused) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  test::save_synthetic(root, test::synthetic_metadata(2, "global_step1", 1, 8), WriteOptions{.chunk_bytes = 400});
  fs::path file = root / "global_step1" / rank_file_name(1);
  {
    h5::Handle f = h5::file_open(file);
    h5::Handle g = h5::group_open(f.get(), "buffers/fp32", file);
    EXPECT_EQ(h5::read_attr_string(g.get(), "checksum", file), "xxh3-64");
    std::vector<uint64_t> sums = h5::read_u64_table(g.get(), "checksums", 1, file);
    h5::Handle ds = h5::dataset_open(g.get(), "data", file);
    h5::Handle space = h5::dataset_space(ds.get(), file, "data");
    std::vector<float> data(static_cast<size_t>(H5Sget_simple_extent_npoints(space.get())));
    ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    ASSERT_EQ(sums.size(), (data.size() + 99) / 100);
    for (size_t c = 0; c < sums.size(); ++c) {
      size_t n = std::min<size_t>(100, data.size() - c * 100);
      EXPECT_EQ(sums[c], detail::block_checksum(data.data() + c * 100, n * sizeof(float))) << c;
    }
  }
  {
    h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_GE(H5Ldelete(f.get(), "buffers/fp32/checksums", H5P_DEFAULT), 0);
  }
  std::string err;
  try {
    CheckpointReader r(root);
    std::vector<float> out(1);
    r.read("fp32", "ln_f.gain", 0, 1, DType::kF32, out.data());
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("checksums"), std::string::npos) << err;
}

// Every vector path of block_checksum gives Debian's libxxhash's XXH3_64bits at every length and
// alignment, so a file written on an AVX2 machine verifies on any other.
TEST(CheckpointChecksum, EveryPathIsXxh3) {
  std::vector<unsigned char> bytes(5000 + 64);
  std::mt19937 rng(5);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (size_t n : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1000, 1024, 4999, 5000}) {
    for (size_t align : {0, 1, 7}) {
      const unsigned char* p = bytes.data() + align;
      uint64_t want = XXH3_64bits(p, n);
      EXPECT_EQ(detail::block_checksum(p, n), want) << n;
      EXPECT_EQ(detail::block_checksum_sse2(p, n), want) << n;
      if (memory::isa_supported(memory::IsaLevel::kAvx2)) {
        EXPECT_EQ(detail::block_checksum_avx2(p, n), want) << n;
      }
      if (memory::isa_supported(memory::IsaLevel::kAvx512)) {
        EXPECT_EQ(detail::block_checksum_avx512(p, n), want) << n;
      }
    }
  }
}

TEST(CheckpointChecksum, OffWritesNoTable) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  // Scale 1000: rank 0 holds 608k elements of embed.weight, a run past kOverlapMinBytes that the
  // reader reads unverified on two threads.
  test::save_synthetic(root, test::synthetic_metadata(2, "global_step1", 1, 1000), WriteOptions{.checksum = false});
  fs::path file = root / "global_step1" / rank_file_name(0);
  h5::Handle f = h5::file_open(file);
  EXPECT_FALSE(h5::exists(f.get(), "buffers/fp32/checksums", file));
  CheckpointReader r(root);
  expect_synthetic(r);
}

// Note [Direct writes] and [Write then hash] (writer.cpp): unfiltered data is written in place whatever
// the appends' sizes. Appends of 777 elements (most straddling a checksum block) and of whole buffers
// (written and hashed in 4 MiB pieces) write the same bytes and the same table, each entry the XXH3 of
// its 64 KiB block as stored. Whole-tensor reads (verified on two threads, Note [Overlapped checksums]
// in reader.cpp) give every element back, and of two corrupt blocks in one read the lower is named.
// Hashing on a second thread while each piece is written (hash_threads 2) changes none of it.
TEST(CheckpointWriter, AnyAppendSizeAndHashThreadsWriteTheSameDataAndChecksums) {
  test::TempDir tmp;
  auto meta = test::synthetic_metadata(2, "global_step1", 1, 1000);  // embed.weight: 800k elements
  std::vector<std::vector<uint64_t>> tables;
  std::vector<std::vector<float>> datas;
  struct Variant {
    const char* name;
    size_t append;
    int hash_threads;
  };
  for (const Variant& v : {Variant{"small", 777, 1}, Variant{"whole", 1u << 24, 1}, Variant{"whole2", 1u << 24, 2},
                           Variant{"small2", 777, 2}}) {
    fs::path dir = fs::path(tmp.path()) / v.name;
    fs::create_directories(dir);
    test::write_synthetic_rank(dir, meta, 1, WriteOptions{.hash_threads = v.hash_threads}, v.append);
    fs::path file = dir / rank_file_name(1);
    h5::Handle f = h5::file_open(file);
    h5::Handle g = h5::group_open(f.get(), "buffers/fp32", file);
    tables.push_back(h5::read_u64_table(g.get(), "checksums", 1, file));
    h5::Handle ds = h5::dataset_open(g.get(), "data", file);
    h5::Handle space = h5::dataset_space(ds.get(), file, "data");
    datas.emplace_back(static_cast<size_t>(H5Sget_simple_extent_npoints(space.get())));
    ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, datas.back().data()), 0);
  }
  for (size_t i = 1; i < datas.size(); ++i) {
    ASSERT_EQ(datas[0], datas[i]) << i;
    ASSERT_EQ(tables[0], tables[i]) << i;
  }
  const size_t block = detail::kBlockBytes / sizeof(float);
  ASSERT_GT(datas[0].size(), 20 * block);
  ASSERT_EQ(tables[0].size(), (datas[0].size() + block - 1) / block);
  for (size_t c = 0; c < tables[0].size(); ++c) {
    const size_t n = std::min(block, datas[0].size() - c * block);
    ASSERT_EQ(tables[0][c], XXH3_64bits(datas[0].data() + c * block, n * sizeof(float))) << c;
  }

  fs::path root = fs::path(tmp.path()) / "root";
  test::save_synthetic(root, meta);
  auto read_all = [&](CheckpointReader& r) {
    for (const BufferLayout& bl : meta.layout.buffers) {
      for (uint32_t t = 0; t < meta.layout.tensors.size(); ++t) {
        const TensorInfo& info = meta.layout.tensors[t];
        std::vector<float> all(info.numel());
        r.read(bl.name, info.name, 0, info.numel(), DType::kF32, all.data());
        const int b = static_cast<int>(&bl - meta.layout.buffers.data());
        for (uint64_t e = 0; e < info.numel(); ++e) {
          const float want = test::synthetic_stored(t, e, b, bl.dtype);
          ASSERT_EQ(all[e], want) << bl.name << " " << info.name << " element " << e;
        }
      }
    }
  };
  {
    CheckpointReader r(root);
    read_all(r);
  }
  // Rank 0 holds embed.weight's first 608k elements, in one 2.4 MB chunk: blocks 5 and 17 of its fp32 data.
  fs::path file = root / "global_step1" / rank_file_name(0);
  flip_byte(file, chunk_address(file, "fp32", 17 * block) + 17 * block * 4 + 9);
  flip_byte(file, chunk_address(file, "fp32", 5 * block) + 5 * block * 4 + 3);
  for (int i = 0; i < 5; ++i) {
    CheckpointReader r(root);
    std::vector<float> out(600000);  // more than kOverlapMinBytes: read on two threads
    std::string err;
    try {
      r.read("fp32", "embed.weight", 0, out.size(), DType::kF32, out.data());
    } catch (const CheckpointError& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("block 5 "), std::string::npos) << err;
  }
}

// Note [Direct reads]: unfiltered data in chunks of 64 KiB or more is read with pread at the chunk
// addresses HDF5's index gives. Every range reads what H5Dread reads, across chunk boundaries and
// rank files, with checksums and without; zstd data is left to HDF5.
TEST(CheckpointDirectRead, ReadsWhatHdf5Reads) {
  for (bool checksum : {true, false}) {
    test::TempDir tmp;
    fs::path root = tmp.path();
    auto meta = test::synthetic_metadata(3, "global_step1", 1, 100);
    test::save_synthetic(root, meta, WriteOptions{.checksum = checksum, .chunk_bytes = 64u << 10});
    fs::path file = root / "global_step1" / rank_file_name(2);
    h5::Handle f = h5::file_open(file);
    for (auto [buffer, type] : {std::pair{"fp32", H5T_NATIVE_FLOAT}, std::pair{"params", H5T_NATIVE_UINT16}}) {
      h5::Handle ds = h5::dataset_open(f.get(), fmt::format("buffers/{}/data", buffer).c_str(), file);
      std::unique_ptr<detail::DirectReader> direct = detail::DirectReader::open(ds.get(), type, file, buffer);
      ASSERT_NE(direct, nullptr) << buffer;
      h5::Handle space = h5::dataset_space(ds.get(), file, buffer);
      const size_t elem = H5Tget_size(type);
      const hsize_t length = static_cast<hsize_t>(H5Sget_simple_extent_npoints(space.get()));
      ASSERT_GT(length * elem, 2u * (64u << 10)) << "several chunks";
      for (hsize_t start : {hsize_t{0}, hsize_t{12345}, length - 40000}) {
        hsize_t n = std::min<hsize_t>(70000, length - start);
        std::vector<std::byte> mine(n * elem), hdf5(n * elem);
        ASSERT_TRUE(direct->read(start, n, mine.data()));
        h5::Handle sel = h5::dataset_space(ds.get(), file, buffer);
        H5Sselect_hyperslab(sel.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr);
        h5::Handle mem = h5::dataspace_simple({n});
        ASSERT_GE(H5Dread(ds.get(), type, mem.get(), sel.get(), H5P_DEFAULT, hdf5.data()), 0);
        EXPECT_EQ(mine, hdf5) << buffer << " [" << start << ", " << start + n << ")";
      }
    }
    CheckpointReader r(root);
    expect_synthetic(r);
  }
  test::TempDir tmp;
  auto meta = test::synthetic_metadata(1, "global_step1", 1, 100);
  test::save_synthetic(tmp.path(), meta, WriteOptions{.compression = Compression::kZstd});
  fs::path file = fs::path(tmp.path()) / "global_step1" / rank_file_name(0);
  h5::Handle f = h5::file_open(file);
  h5::Handle ds = h5::dataset_open(f.get(), "buffers/fp32/data", file);
  EXPECT_EQ(detail::DirectReader::open(ds.get(), H5T_NATIVE_FLOAT, file, "fp32"), nullptr);
}

// Note [Direct writes] (writer.cpp): unfiltered data is written in place in pieces that straddle
// chunks, segments and page-phase gaps. HDF5's own H5Dread (not our direct reader) gives every
// element of every segment back where the rank file's index puts it, across many chunks; the same
// for zstd data (staged whole chunks).
TEST(CheckpointWriter, Hdf5ReadsEverySegmentWhereTheIndexPutsIt) {
  test::TempDir tmp;
  auto meta = test::synthetic_metadata(3, "global_step1", 1, 100);
  for (bool zstd : {false, true}) {
    fs::path dir = fs::path(tmp.path()) / (zstd ? "zstd" : "plain");
    fs::create_directories(dir);
    const WriteOptions opt{.compression = zstd ? Compression::kZstd : Compression::kNone, .chunk_bytes = 64u << 10};
    test::write_synthetic_rank(dir, meta, 2, opt, 5000);
    fs::path file = dir / rank_file_name(2);
    h5::Handle f = h5::file_open(file);
    for (size_t b = 0; b < meta.layout.buffers.size(); ++b) {
      const BufferLayout& bl = meta.layout.buffers[b];
      h5::Handle g = h5::group_open(f.get(), fmt::format("buffers/{}", bl.name).c_str(), file);
      h5::Handle ds = h5::dataset_open(g.get(), "data", file);
      h5::Handle space = h5::dataset_space(ds.get(), file, bl.name);
      // Read as stored (bf16 as uint16), then widened.
      const size_t n = static_cast<size_t>(H5Sget_simple_extent_npoints(space.get()));
      ASSERT_GT(n * memory::dtype_size(bl.dtype), 2u * (64u << 10)) << "several chunks";
      std::vector<std::byte> stored(n * memory::dtype_size(bl.dtype));
      ASSERT_GE(H5Dread(ds.get(), detail::h5_type(bl.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, stored.data()), 0);
      std::vector<float> data(n);
      memory::convert(stored.data(), bl.dtype, data.data(), DType::kF32, n);
      const std::vector<uint64_t> index = h5::read_u64_table(g.get(), "index", 4, file);  // tensor, begin, count, offset
      ASSERT_EQ(index.size(), 4 * bl.ranks[2].size());
      for (size_t row = 0; row < index.size(); row += 4) {
        for (uint64_t i = 0; i < index[row + 2]; ++i) {
          const float want =
              test::synthetic_stored(static_cast<uint32_t>(index[row]), index[row + 1] + i, static_cast<int>(b), bl.dtype);
          ASSERT_EQ(data[index[row + 3] + i], want) << bl.name << " row " << row / 4 << " element " << i;
        }
      }
    }
  }
}

TEST(CheckpointDirectRead, TruncatedFileIsRefusedByName) {
  test::TempDir tmp;
  fs::path root = tmp.path();
  test::save_synthetic(root, test::synthetic_metadata(2, "global_step1", 1, 100));  // 4 MiB chunks
  fs::path file = root / "global_step1" / rank_file_name(1);
  fs::resize_file(file, fs::file_size(file) * 2 / 3);
  std::string err = open_error(root);
  EXPECT_NE(err.find(rank_file_name(1)), std::string::npos) << err;
}

TEST_F(CheckpointCorrupt, FlippedMetadataBytes) {
  flip_byte(meta_file(), find_bytes(meta_file(), "\"tensors\"") + 3);  // inside layout_json
  expect_error(kMetadataFile, "");
  std::string err = open_error(root_);
  EXPECT_FALSE(err.empty());
}

TEST_F(CheckpointCorrupt, FlippedAttributeBytes) {
  flip_byte(rank_file(0), find_bytes(rank_file(0), meta_.run_id) + 2);  // the run id, in an object header
  expect_error(rank_file_name(0), "");
}

// Note [Page phase] in format.h: in format 2, every large segment of unfiltered data starts at a file
// offset congruent to its tensor offset modulo a page; small segments, zstd data and format 1 carry no
// gaps; every layout reads back the same values.
TEST(CheckpointFormat, LargeSegmentsKeepTheirTensorsPagePhase) {
  for (int64_t version : {int64_t{1}, kFormatVersion}) {
    for (Compression compression : {Compression::kNone, Compression::kZstd}) {
      test::TempDir tmp;
      fs::path root = tmp.path();
      auto meta = test::synthetic_metadata(3, "global_step1", 1, 128);  // segments of 2 KiB to 400 KiB
      meta.version = version;
      test::save_synthetic(root, meta, WriteOptions{.compression = compression});
      const bool phased = version >= 2 && compression == Compression::kNone;
      int large = 0, gaps = 0;
      for (int rank = 0; rank < 3; ++rank) {
        fs::path file = root / "global_step1" / rank_file_name(rank);
        h5::Handle f = h5::file_open(file);
        EXPECT_EQ(h5::read_attr_int(f.get(), "format_version", file), version);
        for (const BufferLayout& bl : meta.layout.buffers) {
          const uint64_t elem = memory::dtype_size(bl.dtype);
          h5::Handle g = h5::group_open(f.get(), fmt::format("buffers/{}", bl.name).c_str(), file);
          std::vector<uint64_t> index = h5::read_u64_table(g.get(), "index", 4, file);
          h5::Handle ds = h5::dataset_open(g.get(), "data", file);
          uint64_t end = 0;
          for (size_t i = 0; i < index.size() / 4; ++i) {
            const uint64_t begin = index[4 * i + 1], count = index[4 * i + 2], offset = index[4 * i + 3];
            EXPECT_LT((offset - end) * elem, kPageBytes);
            gaps += offset != end;
            if (!phased || count * elem < kPagePhaseMinBytes) {
              EXPECT_EQ(offset, end) << bl.name << " row " << i;
            } else {
              ++large;
              // The file offset of the segment's first element: its chunk's address (page-aligned) plus
              // its place in the chunk.
              hsize_t chunk = 0;
              h5::Handle dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
              ASSERT_EQ(H5Pget_chunk(dcpl.get(), 1, &chunk), 1);
              hsize_t coord = offset / chunk * chunk;
              unsigned mask = 0;
              haddr_t addr = HADDR_UNDEF;
              hsize_t size = 0;
              ASSERT_GE(H5Dget_chunk_info_by_coord(ds.get(), &coord, &mask, &addr, &size), 0);
              EXPECT_EQ(addr % kPageBytes, 0u) << bl.name;
              EXPECT_EQ((addr + (offset - coord) * elem) % kPageBytes, begin * elem % kPageBytes)
                  << bl.name << " row " << i;
            }
            end = offset + count;
          }
        }
      }
      EXPECT_EQ(large > 0, phased);
      EXPECT_EQ(gaps > 0, phased);
      CheckpointReader r(root);
      EXPECT_EQ(r.metadata().version, version);
      expect_synthetic(r);
    }
  }
}

// A checkpoint saved by zeroshard in format 1 (tests/checkpoint/data/format_v1, made by main's
// checkpoint_save_driver before format 2) loads, every element checked.
TEST(CheckpointFormat, Version1CheckpointLoads) {
  CheckpointReader r(fs::path(ZS_CHECKPOINT_TEST_DATA) / "format_v1");
  EXPECT_EQ(r.metadata().version, 1);
  EXPECT_EQ(r.metadata().tag, "global_step7");
  EXPECT_EQ(r.metadata().layout.world_size, 2);
  expect_synthetic(r);
}

}  // namespace
}  // namespace zs::checkpoint
