// Safetensors: files built byte by byte here from the format's spec (an independent writer) read
// back exactly; our writer's files read back, single and sharded; every corruption refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "tests/support/temp_dir.h"

namespace zs::checkpoint {
namespace {

namespace fs = std::filesystem;

// The spec's layout, by hand: u64 little-endian header length, the header, the data.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::string out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header;
  out += data;
  std::ofstream(path, std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
}

template <typename T>
std::string le_bytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  std::memcpy(s.data(), v.data(), s.size());  // x86 is little-endian, as the format
  return s;
}

// F32 [2, 3] = 0..5, BF16 [4] = 1, -2, 0.5, 3 (bit patterns written out), F16 [2] = 1, -0.25;
// header length 151 (not a multiple of 8), so the data section is unaligned.
std::string hand_built(const test::TempDir& dir) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"h":{"dtype":"F16","shape":[2],"data_offsets":[32,36]}})";
  std::string data = le_bytes(std::vector<float>{0, 1, 2, 3, 4, 5});
  data += le_bytes(std::vector<uint16_t>{0x3f80, 0xc000, 0x3f00, 0x4040});
  data += le_bytes(std::vector<uint16_t>{0x3c00, 0xb400});
  const std::string path = dir.file("hand.safetensors");
  write_raw(path, header, data);
  return path;
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

TEST(Safetensors, ReadsAHandBuiltFile) {
  test::TempDir dir;
  const std::string path = hand_built(dir);
  SafetensorsReader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"b", "h", "w"}));
  EXPECT_EQ(r.file_of("w").metadata().at("format"), "pt");
  std::vector<float> w(6);
  r.read("w", 0, 6, DType::kF32, w.data());
  EXPECT_EQ(w, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  std::vector<float> row(3);
  r.read("w", 3, 3, DType::kF32, row.data());  // the second row alone
  EXPECT_EQ(row, (std::vector<float>{3, 4, 5}));
  std::vector<float> b(4);
  r.read("b", 0, 4, DType::kF32, b.data());
  EXPECT_EQ(b, (std::vector<float>{1, -2, 0.5f, 3}));
  std::vector<float> h(2);
  r.read("h", 0, 2, DType::kF32, h.data());
  EXPECT_EQ(h, (std::vector<float>{1, -0.25f}));
  std::vector<uint16_t> bf(2);
  r.read("w", 1, 2, DType::kBF16, bf.data());  // 1.0 and 2.0 in bf16
  EXPECT_EQ(bf, (std::vector<uint16_t>{0x3f80, 0x4000}));
  const int64_t shape[] = {2, 3};
  EXPECT_NO_THROW(r.expect("w", shape));
  EXPECT_THROW(r.read("w", 4, 3, DType::kF32, row.data()), UsageError);
}

TEST(Safetensors, WriterRoundTripSingleAndSharded) {
  test::TempDir dir;
  std::vector<SafetensorsSpec> specs{{"a.weight", DType::kF32, {3, 5}},
                                     {"b.weight", DType::kBF16, {7}},
                                     {"c.bias", DType::kF16, {4}},
                                     {"empty", DType::kF32, {0, 3}}};
  auto value = [](const SafetensorsSpec& s, uint64_t i) { return static_cast<float>(s.name.size()) + 0.25f * i; };
  auto fill = [&](const SafetensorsSpec& s, SafetensorsWriter& w) {
    for (uint64_t i = 0; i < s.numel(); ++i) {  // one element at a time: appends of any size
      const float v = value(s, i);
      w.append(&v, DType::kF32, 1);
    }
  };
  for (uint64_t limit : {uint64_t{1} << 20, uint64_t{40}}) {
    const fs::path out = fs::path(dir.path()) / std::to_string(limit);
    const auto files = write_safetensors_model(out, specs, {{"format", "pt"}}, limit, fill);
    SafetensorsReader r(out);
    if (limit == 40) {
      ASSERT_EQ(files.size(), 3u);  // a (60 bytes) alone, then b, c and empty (14 + 8 + 0), and the index
      EXPECT_EQ(files.back().filename(), "model.safetensors.index.json");
      EXPECT_EQ(r.file_of("a.weight").path().filename(), "model-00001-of-00002.safetensors");
      EXPECT_EQ(r.file_of("c.bias").path().filename(), "model-00002-of-00002.safetensors");
    } else {
      ASSERT_EQ(files.size(), 1u);
      EXPECT_EQ(files[0].filename(), "model.safetensors");
    }
    for (const SafetensorsSpec& s : specs) {
      EXPECT_EQ(r.tensor(s.name).dtype, safetensors_dtype_name(s.dtype));
      EXPECT_EQ(r.tensor(s.name).shape, s.shape);
      std::vector<float> got(s.numel());
      r.read(s.name, 0, s.numel(), DType::kF32, got.data());
      for (uint64_t i = 0; i < s.numel(); ++i) EXPECT_EQ(got[i], value(s, i)) << s.name << " " << i;
    }
    // The data section starts 8-byte aligned, as the safetensors library writes it.
    std::ifstream f(r.file_of("a.weight").path(), std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ(n % 8, 0u);
  }
}

TEST(Safetensors, WriterRefusesWrongElementCounts) {
  test::TempDir dir;
  std::vector<SafetensorsSpec> specs{{"a", DType::kF32, {4}}, {"b", DType::kF32, {2}}};
  const float v[8] = {};
  const std::string e = error_of([&] {
    write_safetensors_model(dir.path(), specs, {}, 1 << 20,
                            [&](const SafetensorsSpec& s, SafetensorsWriter& w) { w.append(v, DType::kF32, s.numel() - 1); });
  });
  EXPECT_NE(e.find("tensor 'a' was given 3 elements, not 4"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "model.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "model.safetensors.tmp")) << "the partial file is removed";
  SafetensorsWriter w(dir.file("x.safetensors"), specs);
  EXPECT_THROW(w.append(v, DType::kF32, 7), UsageError);
}

struct Corrupt {
  const char* what;
  std::string header;
  size_t data_bytes;
  const char* message;
};

TEST(Safetensors, CorruptFilesAreRefusedByName) {
  test::TempDir dir;
  const std::vector<Corrupt> cases{
      {"truncated", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12,
       "tensor 'w': data_offsets end at 16 past the data section's 12 bytes"},
      {"padded", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 20, "data section has 20 bytes but its tensors cover 16"},
      {"shape", R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", 16, "tensor 'w': data_offsets [0, 16] hold 16 bytes but shape [5] of F32 needs 20"},
      {"overlap", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"v":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16, "overlap"},
      {"hole", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", 16, "tensor 'w': data_offsets start at 4 where the previous tensor ends at 0 (hole)"},
      {"dtype", R"({"w":{"dtype":"F31","shape":[4],"data_offsets":[0,16]}})", 16, "tensor 'w': unknown dtype 'F31'"},
      {"json", R"({"w":{"dtype":"F32",)", 16, "header is not valid JSON"},
      {"entry", R"({"w":{"dtype":"F32","shape":[4]}})", 16, "tensor 'w': an entry needs"},
      {"negative", R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16, "tensor 'w': shape dimension -4 out of range"},
  };
  for (const Corrupt& c : cases) {
    const std::string path = dir.file(std::string(c.what) + ".safetensors");
    write_raw(path, c.header, std::string(c.data_bytes, '\0'));
    const std::string e = error_of([&] { SafetensorsFile f(path); });
    EXPECT_NE(e.find(path), std::string::npos) << c.what << ": " << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.what << ": " << e;
  }
  // A header length past the end, and a file too short for one.
  std::ofstream(dir.file("len.safetensors"), std::ios::binary).write("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10);
  EXPECT_NE(error_of([&] { SafetensorsFile f(dir.file("len.safetensors")); }).find("header length 255 is out of range"),
            std::string::npos);
  std::ofstream(dir.file("short.safetensors"), std::ios::binary).write("\x02\x00", 2);
  EXPECT_NE(error_of([&] { SafetensorsFile f(dir.file("short.safetensors")); }).find("too short"), std::string::npos);
  EXPECT_THROW(SafetensorsFile(dir.file("absent.safetensors")), IoError);
}

TEST(Safetensors, ModelMismatchesNameTheFileAndTensor) {
  test::TempDir dir;
  const std::string path = hand_built(dir);
  SafetensorsReader r(path);
  const int64_t wrong[] = {3, 2};
  std::string e = error_of([&] { r.expect("w", wrong); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'w': shape [2, 3] where the model needs [3, 2]"), std::string::npos) << e;
  e = error_of([&] { r.expect("missing.weight", wrong); });
  EXPECT_NE(e.find("tensor 'missing.weight' is missing"), std::string::npos) << e;
  // A dtype the model cannot take.
  write_raw(dir.file("i64.safetensors"), R"({"t":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", std::string(16, '\0'));
  SafetensorsReader ri(dir.file("i64.safetensors"));
  const int64_t two[] = {2};
  e = error_of([&] { ri.expect("t", two); });
  EXPECT_NE(e.find("tensor 't': dtype I64 where the model needs F32, BF16 or F16"), std::string::npos) << e;
  float out[2];
  EXPECT_THROW(ri.read("t", 0, 2, DType::kF32, out), CheckpointError);
}

TEST(Safetensors, IndexMustMatchItsFiles) {
  test::TempDir dir;
  const fs::path d(dir.path());
  write_raw(dir.file("s1.safetensors"), R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  write_raw(dir.file("s2.safetensors"),
            R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            std::string(8, '\0'));
  auto index = [&](const std::string& text) {
    std::ofstream(d / "model.safetensors.index.json") << text;
  };
  index(R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","x":"s2.safetensors"}})");
  EXPECT_EQ(SafetensorsReader(d).names(), (std::vector<std::string>{"a", "b", "x"}));
  index(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  std::string e = error_of([&] { SafetensorsReader r(d); });
  EXPECT_NE(e.find("s2.safetensors': tensor 'x' is not in the index"), std::string::npos) << e;
  index(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","x":"s2.safetensors","y":"s1.safetensors"}})");
  e = error_of([&] { SafetensorsReader r(d); });
  EXPECT_NE(e.find("s1.safetensors': tensor 'y' is missing"), std::string::npos) << e;
  index(R"({"weight_map":{"a":"gone.safetensors"}})");
  e = error_of([&] { SafetensorsReader r(d); });
  EXPECT_NE(e.find("gone.safetensors"), std::string::npos) << e;
  index(R"({"weight_map":{"a":"../s1.safetensors"}})");
  EXPECT_THROW(SafetensorsReader r(d), CheckpointError);
  index(R"({"metadata":{}})");
  EXPECT_THROW(SafetensorsReader r(d), CheckpointError);
  fs::remove(d / "model.safetensors.index.json");
  e = error_of([&] { SafetensorsReader r(d); });
  EXPECT_NE(e.find("holds neither model.safetensors.index.json nor model.safetensors"), std::string::npos) << e;
}

}  // namespace
}  // namespace zs::checkpoint
