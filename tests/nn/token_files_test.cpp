// Pre-tokenized data: llm.c shards and Megatron indexed datasets written here by small writers that
// follow each format's spec (not our reader's code), read back exactly; windows stay inside a shard
// or document; corrupt headers, wrong sizes and out-of-range tokens are refused naming the file.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "nn/data.h"
#include "tests/support/temp_dir.h"

namespace zs::nn {
namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian, as both formats
  out.append(b, sizeof(T));
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// llm.c's write_datafile: 256 int32 header (magic, version, count), then the tokens.
template <typename T>
std::string llmc_bytes(const std::vector<uint32_t>& tokens, int32_t magic, int32_t version) {
  std::string out;
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  for (int32_t h : header) put(out, h);
  for (uint32_t t : tokens) put(out, static_cast<T>(t));
  return out;
}

// Megatron's _IndexWriter: documents of sequences; returns nothing, writes prefix.bin and .idx.
template <typename T>
void write_megatron(const std::string& prefix, const std::vector<std::vector<std::vector<uint32_t>>>& docs, uint8_t code) {
  std::string bin, idx;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_idx{0};
  int64_t at = 0;
  for (const auto& doc : docs) {
    for (const auto& seq : doc) {
      for (uint32_t t : seq) put(bin, static_cast<T>(t));
      lengths.push_back(static_cast<int32_t>(seq.size()));
      pointers.push_back(at);
      at += static_cast<int64_t>(seq.size() * sizeof(T));
    }
    doc_idx.push_back(static_cast<int64_t>(lengths.size()));
  }
  idx.append("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, code);
  put<uint64_t>(idx, lengths.size());
  put<uint64_t>(idx, doc_idx.size());
  for (int32_t l : lengths) put(idx, l);
  for (int64_t p : pointers) put(idx, p);
  for (int64_t d : doc_idx) put(idx, d);
  write_file(prefix + ".bin", bin);
  write_file(prefix + ".idx", idx);
}

std::vector<uint32_t> run(uint32_t first, uint32_t n) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Every sample of many steps: consecutive tokens (the writers above number tokens so that a window
// crossing a shard or document would break the run) in one "block" of 1000; returns the blocks seen.
std::set<uint32_t> check_windows(const Dataset& ds, int64_t len) {
  std::set<uint32_t> blocks;
  for (uint64_t step = 0; step < 50; ++step) {
    Batch b;
    ds.fill_batch(b, 11, step, 0, 8);
    for (int64_t s = 0; s < 8; ++s) {
      const int32_t* in = b.inputs.data<int32_t>() + s * len;
      const int32_t* tg = b.targets.data<int32_t>() + s * len;
      for (int64_t t = 0; t < len; ++t) {
        EXPECT_EQ(in[t], in[0] + t);
        EXPECT_EQ(tg[t], in[t] + 1);
      }
      EXPECT_EQ(in[0] / 1000, (tg[len - 1]) / 1000) << "a window crosses a segment";
      blocks.insert(static_cast<uint32_t>(in[0]) / 1000);
    }
  }
  return blocks;
}

TEST(TokenFiles, LlmcShardsReadBackExactly) {
  test::TempDir dir;
  write_file(dir.file("train_000.bin"), llmc_bytes<uint16_t>(run(1000, 40), 20240520, 1));
  write_file(dir.file("train_001.bin"), llmc_bytes<uint16_t>(run(2000, 30), 20240520, 1));
  write_file(dir.file("train_002.bin"), llmc_bytes<uint32_t>(run(70000, 20), 20240801, 7));  // uint32 tokens
  Dataset one = Dataset::open_tokens(DataFormat::kLlmc, dir.file("train_000.bin"), 8, 100000);
  EXPECT_EQ(one.num_tokens(), 40u);
  EXPECT_EQ(one.num_windows(), 32u);
  Batch b;
  one.fill_batch(b, 3, 1, 5, 4);
  for (int64_t s = 0; s < 4; ++s) {
    const uint64_t w = one.window_start(3, 1, 5 + static_cast<uint64_t>(s));
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(b.inputs.data<int32_t>()[s * 8 + t], static_cast<int32_t>(1000 + w + t));
      EXPECT_EQ(b.targets.data<int32_t>()[s * 8 + t], static_cast<int32_t>(1000 + w + t + 1));
    }
  }
  Dataset all = Dataset::open_tokens(DataFormat::kLlmc, dir.file("train_*.bin"), 8, 100000);
  EXPECT_EQ(all.num_segments(), 3u);
  EXPECT_EQ(all.num_windows(), 32u + 22u + 12u);
  EXPECT_EQ(check_windows(all, 8), (std::set<uint32_t>{1, 2, 70}));
  // The same global batch however it is split over ranks and micro-batches.
  Batch whole, part;
  all.fill_batch(whole, 4, 2, 0, 6);
  all.fill_batch(part, 4, 2, 3, 3);
  for (int64_t i = 0; i < 3 * 8; ++i) EXPECT_EQ(part.inputs.data<int32_t>()[i], whole.inputs.data<int32_t>()[3 * 8 + i]);
  // A held-out tail: the last 20 tokens are the third shard.
  Dataset tail = all.slice(70, 90, "tail");
  EXPECT_EQ(check_windows(tail, 8), (std::set<uint32_t>{70}));
  EXPECT_EQ(all.slice(0, 70, "head").num_windows(), 54u);
}

TEST(TokenFiles, MegatronDocumentsAreNeverCrossed) {
  test::TempDir dir;
  // Document k's tokens are 1000 (k + 1) + position, over one to three sequences; document 1 is too
  // short for a window of 8 + 1 tokens, document 3 is empty.
  const std::vector<std::vector<std::vector<uint32_t>>> docs{
      {run(1000, 12), run(1012, 5)}, {run(2000, 6)}, {run(3000, 4), run(3004, 4), run(3008, 10)}, {}, {run(5000, 9)}};
  write_megatron<uint16_t>(dir.file("u16"), docs, 8);
  write_megatron<int32_t>(dir.file("i32"), docs, 4);
  write_megatron<int64_t>(dir.file("i64"), docs, 5);
  for (const char* name : {"u16", "i32.bin", "i64.idx"}) {
    Dataset ds = Dataset::open_tokens(DataFormat::kMegatron, dir.file(name), 8, 6000);
    EXPECT_EQ(ds.num_tokens(), 17u + 6u + 18u + 9u);
    EXPECT_EQ(ds.num_segments(), 4u) << "the empty document is no segment";
    EXPECT_EQ(ds.num_sampled_segments(), 3u);
    EXPECT_EQ(ds.num_windows(), 9u + 10u + 1u);
    EXPECT_EQ(check_windows(ds, 8), (std::set<uint32_t>{1, 3, 5})) << name;
  }
}

TEST(TokenFiles, OutOfRangeTokensNameTheFile) {
  test::TempDir dir;
  write_file(dir.file("s.bin"), llmc_bytes<uint16_t>(run(10, 20), 20240520, 1));
  Dataset ds = Dataset::open_tokens(DataFormat::kLlmc, dir.file("s.bin"), 4, 25);  // tokens 25..29 are out
  Batch b;
  std::string e;
  for (uint64_t step = 0; step < 20 && e.empty(); ++step) {
    try {
      ds.fill_batch(b, 1, step, 0, 8);
    } catch (const ConfigError& x) {
      e = x.what();
    }
  }
  EXPECT_NE(e.find(dir.file("s.bin")), std::string::npos) << e;
  EXPECT_NE(e.find("outside [0, model.vocab_size = 25)"), std::string::npos) << e;
  // int32 tokens below zero, too.
  write_megatron<int32_t>(dir.file("neg"), {{{1, 2, 3, static_cast<uint32_t>(-5), 4, 5}}}, 4);
  Dataset neg = Dataset::open_tokens(DataFormat::kMegatron, dir.file("neg"), 5, 100);
  EXPECT_NE(error_of([&] { neg.fill_batch(b, 1, 0, 0, 1); }).find("token -5"), std::string::npos);
}

TEST(TokenFiles, CorruptLlmcShardsAreRefusedByName) {
  test::TempDir dir;
  const std::string good = llmc_bytes<uint16_t>(run(0, 20), 20240520, 1);
  struct Case {
    const char* name;
    std::string bytes;
    const char* message;
  };
  std::string wrong_version = good;
  wrong_version[4] = 2;
  const std::vector<Case> cases{
      {"short.bin", good.substr(0, 100), "shorter than llm.c's 1024-byte header"},
      {"truncated.bin", good.substr(0, good.size() - 3), "but its header's 20 tokens of 2 bytes need 1064 (truncated)"},
      {"trailing.bin", good + "xx", "(trailing bytes)"},
      {"magic.bin", llmc_bytes<uint16_t>(run(0, 20), 20240521, 1), "header magic 20240521 version 1 is not llm.c's"},
      {"version.bin", wrong_version, "header magic 20240520 version 2 is not llm.c's"},
  };
  for (const Case& c : cases) {
    write_file(dir.file(c.name), c.bytes);
    const std::string e = error_of([&] { Dataset::open_tokens(DataFormat::kLlmc, dir.file(c.name), 4, 100); });
    EXPECT_NE(e.find(dir.file(c.name)), std::string::npos) << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.name << ": " << e;
  }
  EXPECT_NE(error_of([&] { Dataset::open_tokens(DataFormat::kLlmc, dir.file("none_*.bin"), 4, 100); }).find("matches no file"),
            std::string::npos);
  EXPECT_THROW(Dataset::open_tokens(DataFormat::kLlmc, dir.file("absent.bin"), 4, 100), IoError);
  write_file(dir.file("tiny.bin"), llmc_bytes<uint16_t>(run(0, 5), 20240520, 1));
  EXPECT_NE(error_of([&] { Dataset::open_tokens(DataFormat::kLlmc, dir.file("tiny.bin"), 8, 100); })
                .find("no shard holds a window of seq_len + 1 = 9 tokens (the longest has 5)"),
            std::string::npos);
}

TEST(TokenFiles, CorruptMegatronIndexesAreRefusedByName) {
  test::TempDir dir;
  write_megatron<uint16_t>(dir.file("good"), {{run(0, 10), run(10, 10)}, {run(20, 10)}}, 8);
  std::string idx;
  {
    std::ifstream f(dir.file("good.idx"), std::ios::binary);
    idx.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::string bin;
  {
    std::ifstream f(dir.file("good.bin"), std::ios::binary);
    bin.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto with = [&](size_t at, const std::string& bytes) {
    std::string s = idx;
    s.replace(at, bytes.size(), bytes);
    return s;
  };
  std::string ptr;  // sequence 1's pointer (after 3 int32 lengths), off by two bytes
  put<int64_t>(ptr, 22);
  std::string doc_end;
  put<int64_t>(doc_end, 2);
  struct Case {
    const char* name;
    std::string idx;
    const char* message;
  };
  const std::vector<Case> cases{
      {"magic", with(0, "MMIDIDY"), "does not start with Megatron's index magic"},
      {"version", with(9, std::string("\x02", 1)), "index version 2"},
      {"dtype", with(17, std::string("\x07", 1)), "token dtype code 7 is not a token type"},
      {"size", idx.substr(0, idx.size() - 8), "but 3 sequences and 3 document indices need"},
      {"pointer", with(34 + 12 + 8, ptr), "sequence 1 points at byte 22 of the .bin, where the lengths before it end at 20"},
      {"docs", with(idx.size() - 8, doc_end), "the document indices must run from 0 to the sequence count 3"},
  };
  for (const Case& c : cases) {
    const std::string prefix = dir.file(c.name);
    write_file(prefix + ".idx", c.idx);
    write_file(prefix + ".bin", bin);
    const std::string e = error_of([&] { Dataset::open_tokens(DataFormat::kMegatron, prefix, 4, 100); });
    EXPECT_NE(e.find(prefix + ".idx"), std::string::npos) << c.name << ": " << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.name << ": " << e;
  }
  write_file(dir.file("short.idx"), idx);
  write_file(dir.file("short.bin"), bin.substr(0, bin.size() - 2));
  const std::string e = error_of([&] { Dataset::open_tokens(DataFormat::kMegatron, dir.file("short"), 4, 100); });
  EXPECT_NE(e.find(dir.file("short.bin") + "': 58 bytes, but its index"), std::string::npos) << e;
  EXPECT_NE(e.find("(truncated)"), std::string::npos) << e;
  EXPECT_THROW(Dataset::open_tokens(DataFormat::kMegatron, dir.file("absent"), 4, 100), IoError);
}

}  // namespace
}  // namespace zs::nn
