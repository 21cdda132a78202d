// Byte tokenizer and dataset: windows, determinism, split independence, file errors, built-in corpus.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "nn/data.h"

namespace zs::nn {
namespace {

using memory::DType;

std::string sample_text() {
  std::string s;
  for (int i = 0; i < 2000; ++i) s += static_cast<char>('a' + (i * 7 + i / 13) % 26);
  return s;
}

TEST(DataTest, ByteTokenizerRoundTrips) {
  const std::string text = std::string("h\xc3\xa9llo\0\xff", 8);
  auto ids = ByteTokenizer::encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[1], 0xc3);
  EXPECT_EQ(ids[7], 255);
  EXPECT_EQ(ByteTokenizer::decode(ids), text);
  std::vector<int32_t> bad = {65, 256};
  EXPECT_THROW(ByteTokenizer::decode(bad), ConfigError);
}

TEST(DataTest, WindowsAreTextSlices) {
  const std::string text = sample_text();
  Dataset ds = Dataset::from_bytes(text, 16);
  EXPECT_EQ(ds.num_windows(), text.size() - 16);
  Batch batch;
  ds.fill_batch(batch, 3, 5, 10, 4);
  ASSERT_EQ(batch.inputs.shape(), (memory::Shape{4, 16}));
  ASSERT_EQ(batch.inputs.dtype(), DType::kI32);
  for (int b = 0; b < 4; ++b) {
    const uint64_t start = ds.window_start(3, 5, 10 + b);
    ASSERT_LT(start, ds.num_windows());
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(batch.inputs.data<int32_t>()[b * 16 + t], static_cast<unsigned char>(text[start + t]));
      EXPECT_EQ(batch.targets.data<int32_t>()[b * 16 + t], static_cast<unsigned char>(text[start + t + 1]));
    }
  }
}

TEST(DataTest, SamplingIsAPureFunction) {
  Dataset a = Dataset::from_bytes(sample_text(), 8);
  Dataset b = Dataset::from_bytes(sample_text(), 8);
  std::set<uint64_t> starts;
  for (uint64_t g = 0; g < 200; ++g) {
    EXPECT_EQ(a.window_start(1, 7, g), b.window_start(1, 7, g));
    starts.insert(a.window_start(1, 7, g));
  }
  EXPECT_GT(starts.size(), 180u) << "starts should be spread over the text";
  EXPECT_NE(a.window_start(1, 7, 0), a.window_start(2, 7, 0)) << "seed must matter";
  EXPECT_NE(a.window_start(1, 7, 0), a.window_start(1, 8, 0)) << "step must matter";
}

TEST(DataTest, VaryingLengthsArePrefixesOfTheWindowsAndDrawnPerStep) {
  Dataset ds = Dataset::from_bytes(sample_text(), 32);
  std::set<int64_t> lengths;
  for (uint64_t step = 0; step < 200; ++step) {
    const int64_t n = ds.seq_len_at(5, step, 8);
    ASSERT_GE(n, 8);
    ASSERT_LE(n, 32);
    ASSERT_EQ(n, ds.seq_len_at(5, step, 8)) << "a pure function of (seed, step)";
    lengths.insert(n);
  }
  EXPECT_GT(lengths.size(), 20u) << "lengths should spread over [8, 32]";
  EXPECT_TRUE(lengths.contains(8) && lengths.contains(32)) << "both ends are reachable";
  EXPECT_EQ(ds.seq_len_at(5, 3, 32), 32);  // min_len == seq_len: fixed length
  Batch full, part;
  ds.fill_batch(full, 5, 3, 6, 3);
  ds.fill_batch(part, 5, 3, 6, 3, 10);
  ASSERT_EQ(part.inputs.shape(), (memory::Shape{3, 10}));
  ASSERT_EQ(part.targets.shape(), (memory::Shape{3, 10}));
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t t = 0; t < 10; ++t) {
      EXPECT_EQ(part.inputs.data<int32_t>()[b * 10 + t], full.inputs.data<int32_t>()[b * 32 + t]);
      EXPECT_EQ(part.targets.data<int32_t>()[b * 10 + t], full.targets.data<int32_t>()[b * 32 + t]);
    }
  }
}

TEST(DataTest, GlobalBatchDoesNotDependOnHowItIsSplit) {
  Dataset ds = Dataset::from_bytes(sample_text(), 12);
  Batch whole;
  ds.fill_batch(whole, 9, 4, 0, 12);
  // 3 ranks x 2 micro-batches of 2 samples, in any order of filling.
  for (int rank : {2, 0, 1}) {
    for (int micro = 0; micro < 2; ++micro) {
      const uint64_t first = static_cast<uint64_t>(rank) * 4 + static_cast<uint64_t>(micro) * 2;
      Batch part;
      ds.fill_batch(part, 9, 4, first, 2);
      for (int64_t i = 0; i < 2 * 12; ++i) {
        ASSERT_EQ(part.inputs.data<int32_t>()[i], whole.inputs.data<int32_t>()[first * 12 + i]);
        ASSERT_EQ(part.targets.data<int32_t>()[i], whole.targets.data<int32_t>()[first * 12 + i]);
      }
    }
  }
}

TEST(DataTest, FileDatasetIsMemoryMapped) {
  const std::string path = ::testing::TempDir() + "zs_data_test_" + std::to_string(::getpid()) + ".txt";
  const std::string text = sample_text();
  std::ofstream(path, std::ios::binary) << text;
  {
    Dataset ds = Dataset::open(path, 32);
    EXPECT_EQ(ds.bytes(), text);
    Dataset copy = ds;  // shares the mapping
    Batch from_file, from_memory;
    copy.fill_batch(from_file, 1, 2, 3, 5);
    Dataset::from_bytes(text, 32).fill_batch(from_memory, 1, 2, 3, 5);
    for (int64_t i = 0; i < 5 * 32; ++i) ASSERT_EQ(from_file.inputs.data<int32_t>()[i], from_memory.inputs.data<int32_t>()[i]);
  }
  std::remove(path.c_str());
}

TEST(DataTest, BadFilesAreReportedWithThePath) {
  try {
    Dataset::open("/nonexistent/zs/corpus.txt", 8);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/zs/corpus.txt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Dataset::open(::testing::TempDir(), 8), IoError);  // a directory
  const std::string path = ::testing::TempDir() + "zs_data_small_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(path, std::ios::binary) << "0123456789";
  try {
    Dataset::open(path, 10);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("at least 11 bytes"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(Dataset::open(path, 9));
  std::ofstream(path, std::ios::binary | std::ios::trunc);  // empty file
  EXPECT_THROW(Dataset::open(path, 4), ConfigError);
  std::remove(path.c_str());
  EXPECT_THROW(Dataset::from_bytes("abc", 3), ConfigError);
  EXPECT_THROW(Dataset::from_bytes("abcdef", 0), ConfigError);
}

TEST(DataTest, BuiltinCorpusIsEmbedded) {
  std::string_view corpus = builtin_corpus();
  EXPECT_GE(corpus.size(), 100u * 1000u);
  EXPECT_NE(corpus.find("==> README.md <=="), std::string_view::npos);
  EXPECT_NE(corpus.find("namespace zs::nn"), std::string_view::npos);
  Dataset ds = Dataset::builtin(256);
  EXPECT_EQ(ds.bytes().data(), corpus.data()) << "no copy";
  EXPECT_THROW(Dataset::builtin(static_cast<int64_t>(corpus.size())), ConfigError);
}

}  // namespace
}  // namespace zs::nn
