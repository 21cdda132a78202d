// inspect, consolidate and compare on synthetic checkpoints written through the writer API.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "checkpoint/h5.h"
#include "checkpoint/tools.h"
#include "tests/checkpoint/synthetic.h"
#include "tests/support/temp_dir.h"

namespace zs::checkpoint {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointTools, InspectListsTagsShapesScalarsAndConfigDiff) {
  test::TempDir tmp;
  test::save_synthetic(tmp.path(), test::synthetic_metadata(3, "global_step5", 5));
  test::save_synthetic(tmp.path(), test::synthetic_metadata(3, "global_step9", 9));
  std::string text =
      inspect(tmp.path(), std::string(R"({"train_batch_size": 16, "zero_optimization": {"stage": 3}, "fp16": {}})"));
  for (const char* want : {"2 tag(s), latest: global_step9", "global_step5  step 5  world_size 3",
                           "global_step9 (latest)  step 9", "tensor embed.weight (50, 16) bf16",
                           "tensor ln_f.gain () bf16", "buffer fp32: fp32, 2641 elements, 10564 bytes",
                           "scalar global_step = 9", "config ~ train_batch_size: 8 -> 16",
                           "config - bf16.enabled: true (only in the checkpoint)", "config + fp16: {} (only in --config)",
                           "config: 3 difference(s)"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in\n" << text;
  }
}

TEST(CheckpointTools, ConsolidateWritesFullFp32TensorsByName) {
  test::TempDir tmp;
  fs::path root = fs::path(tmp.path()) / "ckpt", out = fs::path(tmp.path()) / "full.h5";
  auto meta = test::synthetic_metadata(4, "global_step3", 3);
  test::save_synthetic(root, meta);
  // A piece smaller than a row, so pieces cut rows of the 2-D tensors.
  EXPECT_EQ(consolidate(root, out, 44), meta.layout.tensors.size());
  h5::Handle file = h5::file_open(out);
  for (uint32_t t = 0; t < meta.layout.tensors.size(); ++t) {
    const TensorInfo& info = meta.layout.tensors[t];
    h5::Handle ds = h5::dataset_open(file.get(), info.name.c_str(), out);
    h5::Handle space = h5::dataset_space(ds.get(), out, info.name);
    int nd = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    EXPECT_EQ(std::vector<uint64_t>(dims.begin(), dims.end()), info.shape) << info.name;
    std::vector<float> values(info.numel());
    ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    for (uint64_t e = 0; e < info.numel(); ++e) {
      ASSERT_EQ(values[e], test::synthetic_value(t, e, 1)) << info.name << " " << e;  // the fp32 master
    }
  }
  EXPECT_EQ(h5::read_attr_int(file.get(), "global_step", out), 3);
}

TEST(CheckpointTools, CompareAcrossWorldSizesAndFindsDifferences) {
  test::TempDir tmp;
  fs::path a = fs::path(tmp.path()) / "a", b = fs::path(tmp.path()) / "b", c = fs::path(tmp.path()) / "c";
  test::save_synthetic(a, test::synthetic_metadata(2, "t", 1));
  test::save_synthetic(b, test::synthetic_metadata(3, "t", 1));  // same values, another layout
  CompareResult same = compare(a, b);
  EXPECT_TRUE(same.equal) << same.report;
  EXPECT_NE(same.report.find("equal: 18 tensor buffers compared"), std::string::npos) << same.report;

  // C: rank 1 writes exp_avg values off by 1e-3 relative, and another step.
  auto meta = test::synthetic_metadata(2, "t", 2);
  auto dir = begin_save(c, "t");
  test::write_synthetic_rank(dir, meta, 0, {});
  {
    ShardWriter w(dir, meta, 1, {});
    for (size_t bi = 0; bi < meta.layout.buffers.size(); ++bi) {
      const BufferLayout& bl = meta.layout.buffers[bi];
      std::vector<float> v;
      for (const Segment& s : bl.ranks[1]) {
        for (uint64_t e = s.begin; e < s.begin + s.count; ++e) {
          float x = test::synthetic_value(s.tensor, e, static_cast<int>(bi));
          v.push_back(bl.name == "exp_avg" ? x * 1.001f : x);
        }
      }
      std::vector<std::byte> bytes(v.size() * memory::dtype_size(bl.dtype));
      memory::convert(v.data(), DType::kF32, bytes.data(), bl.dtype, v.size());
      w.append(bl.name, bytes);
    }
    w.finish();
  }
  write_metadata(dir, meta);
  commit_save(c, "t", 0);
  CompareResult diff = compare(a, c);
  EXPECT_FALSE(diff.equal);
  EXPECT_NE(diff.report.find("exp_avg[ln_f.gain]: 1 of 1 elements differ (first at 0: "), std::string::npos)
      << diff.report;
  EXPECT_NE(diff.report.find(" in A, "), std::string::npos) << diff.report;  // the two values, not "A vs B"
  EXPECT_NE(diff.report.find("scalar global_step: 1 in A, 2 in B"), std::string::npos) << diff.report;
  EXPECT_EQ(diff.report.find("fp32["), std::string::npos) << diff.report;
  CompareResult loose = compare(a, c, 2e-3);
  EXPECT_EQ(loose.report.find("exp_avg["), std::string::npos) << loose.report;
}

// Issue 39: a 2-rank stage-0 checkpoint and a 1-rank stage-3 one of the same state are equal; their
// world_size, zero.stage and offload scalars are layout, reported as such (Note [compare: state and
// layout]); a one-bit optimizer's per-rank tensors too. A training scalar that differs still counts.
TEST(CheckpointTools, CompareReportsLayoutAsInformation) {
  test::TempDir tmp;
  fs::path a = fs::path(tmp.path()) / "a", b = fs::path(tmp.path()) / "b", c = fs::path(tmp.path()) / "c";
  auto meta_a = test::synthetic_metadata(2, "t", 1);
  meta_a.scalars["world_size"] = int64_t{2};
  meta_a.scalars["zero.stage"] = int64_t{0};
  meta_a.scalars["offload_optimizer"] = std::string("none");
  meta_a.layout.tensors.push_back({"error_feedback.worker.rank1", {4}, DType::kF32});
  test::save_synthetic(a, meta_a);
  auto meta_b = test::synthetic_metadata(1, "t", 1);
  meta_b.scalars["world_size"] = int64_t{1};
  meta_b.scalars["zero.stage"] = int64_t{3};
  meta_b.scalars["offload_param"] = std::string("cpu");  // offload_optimizer only in A
  test::save_synthetic(b, meta_b);
  CompareResult same = compare(a, b);
  EXPECT_TRUE(same.equal) << same.report;
  for (const char* want : {"layout: scalar world_size: 2 in A, 1 in B", "layout: scalar zero.stage: 0 in A, 3 in B",
                           "layout: scalar offload_optimizer: only in A", "layout: scalar offload_param: only in B",
                           "layout: tensor error_feedback.worker.rank1: only in A (per rank)",
                           "equal: 18 tensor buffers compared (rtol 0, atol 0); 5 layout difference(s), not state"}) {
    EXPECT_NE(same.report.find(want), std::string::npos) << "missing '" << want << "' in\n" << same.report;
  }
  auto meta_c = meta_b;
  meta_c.scalars["steps_taken"] = int64_t{4};  // state: still a difference
  test::save_synthetic(c, meta_c);
  CompareResult diff = compare(a, c, 1.0, 1.0);
  EXPECT_FALSE(diff.equal) << diff.report;
  EXPECT_NE(diff.report.find("\nscalar steps_taken: only in B\n"), std::string::npos) << diff.report;
}

// 1.0 in the saved config and 1 in --config are one number (Boost writes the first as 1E0).
TEST(CheckpointTools, InspectComparesConfigNumbersAsNumbers) {
  test::TempDir tmp;
  auto meta = test::synthetic_metadata(1, "t", 1);
  meta.config_json = R"({"gradient_clipping": 1.0, "lr": 0.001, "betas": [0.9, 0.95], "n": 8, "s": "a"})";
  test::save_synthetic(tmp.path(), meta);
  const std::string same = inspect(tmp.path(), std::string(R"({"gradient_clipping": 1, "lr": 1e-3, "betas": [0.9, 9.5e-1], "n": 8.0, "s": "a"})"));
  EXPECT_NE(same.find("config: 0 difference(s)"), std::string::npos) << same;
  const std::string diff = inspect(tmp.path(), std::string(R"({"gradient_clipping": 0.5, "lr": 0.001, "betas": [0.9], "n": 8, "s": "b"})"));
  for (const char* want : {"config ~ gradient_clipping: 1 -> 0.5", "config ~ betas: [0.9,0.95] -> [0.9]", "config ~ s: \"a\" -> \"b\"",
                           "config: 3 difference(s)"}) {
    EXPECT_NE(diff.find(want), std::string::npos) << "missing '" << want << "' in\n" << diff;
  }
}

TEST(CheckpointTools, MissingCheckpointIsACheckpointError) {
  test::TempDir tmp;
  EXPECT_THROW(inspect(tmp.path(), std::nullopt), CheckpointError);
  EXPECT_THROW(consolidate(fs::path(tmp.path()) / "nope", fs::path(tmp.path()) / "o.h5"), CheckpointError);
}

}  // namespace
}  // namespace zs::checkpoint
