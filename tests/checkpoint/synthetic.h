// A synthetic checkpoint written through the writer API by one process: several ranks' files with
// uneven ranges, buffers "params" (bf16), "fp32" and "exp_avg" (fp32), values from a formula so
// readers can check any element. Shared by the checkpoint tests and the h5py fixture.
#pragma once

#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace zs::test {

// Element e of tensor t in buffer b (b: 0 params, 1 fp32, 2 exp_avg).
inline float synthetic_value(uint32_t t, uint64_t e, int b) {
  return static_cast<float>(t) * 100.0f + static_cast<float>(e % 4096) * 0.25f + static_cast<float>(b) * 0.125f -
         50.0f;
}

// synthetic_value as a buffer of `dtype` stores it and a read widens it back to fp32 (bf16 rounds).
inline float synthetic_stored(uint32_t t, uint64_t e, int b, memory::DType dtype) {
  const float v = synthetic_value(t, e, b);
  return dtype == memory::DType::kBF16 ? memory::bf16_to_f32(memory::f32_to_bf16(v)) : v;
}

// Tensors of several shapes, flattened end to end and cut into `world` uneven pieces (a ZeRO-style
// flat partition), so ranges straddle tensors and ranks.
inline checkpoint::Layout synthetic_layout(int world, uint64_t scale = 1) {
  using namespace checkpoint;
  Layout layout;
  layout.world_size = world;
  layout.tensors = {{"embed.weight", {50 * scale, 16}, DType::kBF16},
                    {"h.0.attn.w", {16, 48}, DType::kBF16},
                    {"h.0.attn.b", {48}, DType::kBF16},
                    {"h.0.moe.experts.0.w1", {16, 32 * scale}, DType::kBF16},
                    {"h.0.moe.experts.1.w1", {16, 32 * scale}, DType::kBF16},
                    {"ln_f.gain", {}, DType::kBF16}};
  uint64_t total = 0;
  for (const auto& t : layout.tensors) total += t.numel();
  // Uneven cut points: rank r gets a share proportional to r + 1.
  std::vector<uint64_t> cuts{0};
  uint64_t weights = static_cast<uint64_t>(world) * (world + 1) / 2, acc = 0;
  for (int r = 0; r < world; ++r) {
    acc += static_cast<uint64_t>(r + 1);
    cuts.push_back(total * acc / weights);
  }
  std::vector<std::vector<Segment>> ranks(static_cast<size_t>(world));
  uint64_t flat = 0;
  for (uint32_t t = 0; t < layout.tensors.size(); ++t) {
    uint64_t n = layout.tensors[t].numel();
    for (int r = 0; r < world; ++r) {
      uint64_t lo = std::max(flat, cuts[static_cast<size_t>(r)]), hi = std::min(flat + n, cuts[static_cast<size_t>(r) + 1]);
      if (lo < hi) ranks[static_cast<size_t>(r)].push_back(Segment{t, lo - flat, hi - lo});
    }
    flat += n;
  }
  layout.buffers = {{"params", DType::kBF16, ranks}, {"fp32", DType::kF32, ranks}, {"exp_avg", DType::kF32, ranks}};
  return layout;
}

inline checkpoint::Metadata synthetic_metadata(int world, const std::string& tag, int64_t step, uint64_t scale = 1) {
  checkpoint::Metadata meta;
  meta.run_id = checkpoint::new_run_id();
  meta.tag = tag;
  meta.layout = synthetic_layout(world, scale);
  meta.scalars = {{"global_step", step}, {"loss_scaler.scale", 65536.0}, {"rng.state", std::string("seed=42;n=7")}};
  meta.config_json = R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}, "bf16": {"enabled": true}})";
  return meta;
}

// Writes rank `rank`'s file, appending each buffer in pieces of `piece` elements.
inline void write_synthetic_rank(const std::filesystem::path& dir, const checkpoint::Metadata& meta, int rank,
                                 const checkpoint::WriteOptions& options, uint64_t piece = 777) {
  using namespace checkpoint;
  ShardWriter w(dir, meta, rank, options);
  for (size_t b = 0; b < meta.layout.buffers.size(); ++b) {
    const BufferLayout& bl = meta.layout.buffers[b];
    std::vector<float> values;
    for (const Segment& s : bl.ranks[static_cast<size_t>(rank)]) {
      for (uint64_t e = s.begin; e < s.begin + s.count; ++e) values.push_back(synthetic_value(s.tensor, e, static_cast<int>(b)));
    }
    std::vector<std::byte> bytes(values.size() * memory::dtype_size(bl.dtype));
    memory::convert(values.data(), DType::kF32, bytes.data(), bl.dtype, values.size());
    const size_t step = piece * memory::dtype_size(bl.dtype);
    for (size_t off = 0; off < bytes.size(); off += step) {
      w.append(bl.name, std::span<const std::byte>(bytes).subspan(off, std::min(step, bytes.size() - off)));
    }
  }
  w.finish();
}

// A whole save of every rank by this process: begin, ranks, metadata, commit.
inline void save_synthetic(const std::filesystem::path& root, const checkpoint::Metadata& meta,
                           const checkpoint::WriteOptions& options = {}, int keep_last = 0) {
  auto dir = checkpoint::begin_save(root, meta.tag);
  for (int r = 0; r < meta.layout.world_size; ++r) write_synthetic_rank(dir, meta, r, options);
  checkpoint::write_metadata(dir, meta);
  checkpoint::commit_save(root, meta.tag, keep_last);
}

}  // namespace zs::test
