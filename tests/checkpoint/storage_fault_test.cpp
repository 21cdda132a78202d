// Storage faults during a save (Note [Storage faults] in checkpoint/h5.cpp): a full device and
// a read-only filesystem are IoErrors naming the file or directory (and, when full, the bytes being
// written and the space left), and `latest` keeps naming the previous, loadable tag. Each test mounts
// a small tmpfs of its own, which needs root (CAP_SYS_ADMIN); elsewhere the tests are skipped.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"
#include "tests/checkpoint/synthetic.h"
#include "tests/support/temp_dir.h"

namespace zs::checkpoint {
namespace {

namespace fs = std::filesystem;

class StorageFault : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a size-limited tmpfs needs root (CAP_SYS_ADMIN)";
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=2m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs on " << mnt_ << ": " << std::strerror(errno)
                   << " (a container without CAP_SYS_ADMIN)";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
  }
  // Every element of every tensor of the tag `latest` names, read and checked.
  static void expect_loads(const fs::path& root, const Metadata& want) {
    CheckpointReader r(root);
    ASSERT_EQ(r.metadata().run_id, want.run_id);
    for (const TensorInfo& t : r.metadata().layout.tensors) {
      std::vector<float> v(t.numel());
      r.read("exp_avg", t.name, 0, t.numel(), DType::kF32, v.data());
      EXPECT_EQ(v.back(), test::synthetic_value(static_cast<uint32_t>(r.metadata().layout.find_tensor(t.name)),
                                                t.numel() - 1, 2));
    }
  }
  test::TempDir tmp_;
  fs::path mnt_ = tmp_.path();
  fs::path root_ = mnt_ / "ckpt";
  bool mounted_ = false;
};

TEST_F(StorageFault, FullDeviceIsAnIoErrorAndLatestStays) {
  auto a = test::synthetic_metadata(2, "global_step1", 1);
  test::save_synthetic(root_, a);
  auto b = test::synthetic_metadata(2, "global_step2", 2, 200);  // about 3.6 MB: past the 2 MiB mount
  std::string err;
  try {
    test::save_synthetic(root_, b);
  } catch (const IoError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("zs_rank_0000"), std::string::npos) << err;
  EXPECT_NE(err.find("no space left on the device"), std::string::npos) << err;
  EXPECT_NE(err.find(" bytes)"), std::string::npos) << err;      // the write's size
  EXPECT_NE(err.find("bytes free"), std::string::npos) << err;  // and the space left
  EXPECT_EQ(read_latest(root_), "global_step1");
  expect_loads(root_, a);
  // The next save removes the failed save's staging directory, so it fits again.
  auto c = test::synthetic_metadata(2, "global_step3", 3);
  test::save_synthetic(root_, c);
  EXPECT_EQ(read_latest(root_), "global_step3");
  expect_loads(root_, c);
}

// The same failure inside a write running beside its hash on a second thread (hash_threads 2, whole
// appends so each 4 MiB piece's write and hash run at once): the error reaches the caller as is.
TEST_F(StorageFault, FullDeviceWhileHashingOnTwoThreadsIsTheSameIoError) {
  auto a = test::synthetic_metadata(2, "global_step1", 1);
  test::save_synthetic(root_, a);
  auto b = test::synthetic_metadata(2, "global_step2", 2, 200);
  std::string err;
  try {
    const fs::path dir = begin_save(root_, b.tag);
    for (int r = 0; r < b.layout.world_size; ++r) {
      test::write_synthetic_rank(dir, b, r, WriteOptions{.hash_threads = 2}, uint64_t{1} << 24);
    }
  } catch (const IoError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("zs_rank_0000"), std::string::npos) << err;
  EXPECT_NE(err.find("no space left on the device"), std::string::npos) << err;
  EXPECT_EQ(read_latest(root_), "global_step1");
  expect_loads(root_, a);
}

TEST_F(StorageFault, ReadOnlyFilesystemIsAnIoErrorAndLatestStays) {
  auto a = test::synthetic_metadata(2, "global_step1", 1);
  test::save_synthetic(root_, a);
  ASSERT_EQ(::mount("tmpfs", mnt_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=2m"), 0) << std::strerror(errno);
  std::string err;
  try {
    test::save_synthetic(root_, test::synthetic_metadata(2, "global_step2", 2));
  } catch (const IoError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find(root_.string()), std::string::npos) << err;
  EXPECT_NE(err.find("Read-only file system"), std::string::npos) << err;
  EXPECT_EQ(read_latest(root_), "global_step1");
  expect_loads(root_, a);
}

}  // namespace
}  // namespace zs::checkpoint
