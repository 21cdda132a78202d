// Engine::param_digest: one SHA-256 of the whole model, the same on every rank and for every ep_size,
// tp and pp.
#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>

#include "core/errors.h"
#include "engine/detail/engine_impl.h"

namespace zs::engine {

// Note [whole-model digest]
// A rank holds 1/ep_size of the experts, so a digest over its own parameters differs between ep
// sizes. Hashing the parameters' values in one stream would need every expert's values on one rank;
// instead each parameter gets its own SHA-256 (its full fp32 values, gathered over its partition
// group at stages >= 1), and the model's digest is the SHA-256 of those 32-byte digests in name
// order. With expert sets the ranks exchange (name, digest) pairs of their expert parameters over dp
// (a few bytes per parameter) and keep each name once: the edp replicas of an expert hold the same
// values. Dense and ep_size-1 models take the same definition without the exchange.
// With tensor parallelism (Note [tensor-parallel parameters] in engine/engine.h) a TP shard is hashed
// as its full tp = 1 tensor (gathered over tp), so the digest is the same for every tp degree; a
// replicated parameter is hashed as it is, and the tp ranks compare those hashes (one allgather of
// 32 bytes per replicated parameter): replicas that differ in any bit are a ModelError naming the
// parameter, not a digest that silently depends on which rank wrote it.
// With pipeline parallelism (Note [pipeline stages in the engine] in engine/pipeline_model.h) a rank
// holds its stage's parameters: the stages exchange their (name, digest) pairs over the "pp" group
// as the expert sets do over dp, so every rank digests the whole model under the pp = 1 model's names
// and the digest equals pp = 1's for equal parameters. A tied embedding's two copies (first and last
// stage) appear once; copies whose digests differ are a ModelError naming the parameter and the
// stages, as for tp replicas.

namespace {

using Sha256 = std::array<unsigned char, 32>;

Sha256 sha256(const void* data, size_t bytes) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  ZS_ASSERT(md && EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) == 1, "OpenSSL SHA-256 init failed");
  EVP_DigestUpdate(md.get(), data, bytes);
  Sha256 out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(md.get(), out.data(), &len);
  ZS_ASSERT(len == out.size(), "SHA-256 of {} bytes", len);
  return out;
}

// Entries as int32 words (the collectives move int32 as bytes): [name bytes, 0-padded to 4][32 bytes].
// Each entry starts with its name's length in bytes.
std::vector<int32_t> pack(const std::map<std::string, Sha256>& entries) {
  std::vector<int32_t> words;
  for (const auto& [name, hash] : entries) {
    words.push_back(static_cast<int32_t>(name.size()));
    const size_t at = words.size();
    words.resize(at + (name.size() + 3) / 4 + hash.size() / 4, 0);
    std::memcpy(words.data() + at, name.data(), name.size());
    std::memcpy(words.data() + at + (name.size() + 3) / 4, hash.data(), hash.size());
  }
  return words;
}

// Merges `words` (pack's) into `into`; `conflict(name)` is called where a name already in has another digest.
template <class OnConflict>
void unpack(std::span<const int32_t> words, std::map<std::string, Sha256>& into, OnConflict conflict) {
  for (size_t i = 0; i < words.size();) {
    const auto len = static_cast<size_t>(words[i++]);
    std::string name(len, '\0');
    std::memcpy(name.data(), words.data() + i, len);
    i += (len + 3) / 4;
    Sha256 hash{};
    std::memcpy(hash.data(), words.data() + i, hash.size());
    i += hash.size() / 4;
    auto [it, added] = into.emplace(std::move(name), hash);  // a replica's copy already in: the same values
    if (!added && it->second != hash) conflict(it->first);
  }
}

// Every rank's entries of `group` to every rank, merged in rank order (collective over `group`);
// conflict(name, q) where rank q's digest of a name already in differs.
template <class OnConflict>
void exchange(const comm::Group& group, std::map<std::string, Sha256>& entries, OnConflict conflict) {
  std::vector<int32_t> mine = pack(entries);
  int32_t count = static_cast<int32_t>(mine.size());
  std::vector<int32_t> counts(static_cast<size_t>(group.size()));
  group.allgather(memory::Tensor(&count, memory::DType::kI32, {1}),
                  memory::Tensor(counts.data(), memory::DType::kI32, {group.size()}));
  std::vector<size_t> sizes(counts.begin(), counts.end());
  size_t total = 0;
  for (size_t c : sizes) total += c;
  std::vector<int32_t> all(std::max<size_t>(total, 1));
  mine.resize(std::max<size_t>(mine.size(), 1));
  group.allgatherv(memory::Tensor(mine.data(), memory::DType::kI32, {static_cast<int64_t>(count)}),
                   memory::Tensor(all.data(), memory::DType::kI32, {static_cast<int64_t>(total)}), sizes);
  size_t at = 0;
  for (int q = 0; q < group.size(); ++q) {
    unpack(std::span<const int32_t>(all.data() + at, sizes[static_cast<size_t>(q)]), entries,
           [&](const std::string& name) { conflict(name, q); });
    at += sizes[static_cast<size_t>(q)];
  }
}

// Every tp rank's digests of its replicated parameters (`names` in slot order, the same on every tp
// rank) must be equal; the first that differs is a ModelError on every rank. Collective over `tp`.
void check_replicas(const comm::Group& tp, const std::vector<std::string>& names, const std::vector<Sha256>& hashes) {
  constexpr size_t kWords = sizeof(Sha256) / sizeof(int32_t);
  std::vector<int32_t> mine(std::max<size_t>(1, hashes.size()) * kWords, 0);
  if (!hashes.empty()) std::memcpy(mine.data(), hashes.data(), hashes.size() * sizeof(Sha256));
  std::vector<int32_t> all(mine.size() * static_cast<size_t>(tp.size()));
  tp.allgather(memory::Tensor(mine.data(), memory::DType::kI32, {static_cast<int64_t>(mine.size())}),
               memory::Tensor(all.data(), memory::DType::kI32, {static_cast<int64_t>(all.size())}));
  for (size_t i = 0; i < names.size(); ++i) {
    for (int r = 1; r < tp.size(); ++r) {
      const int32_t* first = all.data() + i * kWords;
      const int32_t* other = all.data() + static_cast<size_t>(r) * mine.size() + i * kWords;
      if (std::memcmp(first, other, sizeof(Sha256)) != 0) {
        throw ModelError(fmt::format(
            "parameter '{}' is replicated over the tensor-parallel group (its slice is whole) but its values on tp "
            "rank {} differ from tp rank 0's: a replicated parameter must get the same gradient on every tp rank (a "
            "layer whose output gradient differs between tp ranks, or a parameter used on sequence shards whose "
            "gradient is not summed over tp, breaks that; Note [tensor-parallel parameters] in engine/engine.h)",
            names[i], r));
      }
    }
  }
}

}  // namespace

std::string Engine::param_digest() const {
  // Set by set (each set's gathers are collective over its own group, in its slot order).
  std::map<std::string, Sha256> dense, experts;
  std::vector<std::string> replicated;  // tp > 1: the replicated parameters, and their digests
  std::vector<Sha256> replicated_hashes;
  for (const auto& set : impl_->sets_) {
    for (const ParamSlot& s : set->layout.slots()) {
      // A TP shard's full tensor (Note [whole-model digest]). x86-64: little-endian bytes as they are.
      std::vector<float> values = impl_->gather_full(*s.param, impl_->gather_fp32(*set, s));
      const Sha256 hash = sha256(values.data(), values.size() * sizeof(float));
      (set->expert() ? experts : dense)[s.param->full_name()] = hash;
      if (tp_ != nullptr && s.param->tensor_slice().whole()) {
        replicated.push_back(s.param->full_name());
        replicated_hashes.push_back(hash);
      }
    }
  }
  if (tp_ != nullptr) check_replicas(*tp_, replicated, replicated_hashes);
  const bool any_experts = std::any_of(impl_->sets_.begin(), impl_->sets_.end(), [](const auto& s) { return s->expert(); });
  if (any_experts && group_.size() > 1 && group_.is_mpi()) {
    // Every rank's expert entries to every rank (Note [whole-model digest]); edp replicas hold the
    // same values, and the first copy in rank order stays.
    exchange(group_, experts, [](const std::string&, int) {});
  }
  dense.merge(experts);
  if (const comm::Group* pp = pipeline_parallel(); pp != nullptr && pp->size() > 1 && pp->is_mpi()) {
    // Every stage's entries to every stage (Note [whole-model digest]).
    exchange(*pp, dense, [&](const std::string& name, int stage) {
      throw ModelError(fmt::format(
          "parameter '{}' is held by pipeline stages {} and {} of the \"{}\" group (a tied embedding's copies) with "
          "different values: the copies' gradients must be summed between their stages every step "
          "(engine::PipelineModel::shared_params, Note [pipeline stages in the engine] in engine/pipeline_model.h)",
          name, std::min(stage, pp->rank()), std::max(stage, pp->rank()), pp->name()));
    });
  }
  std::vector<unsigned char> stream;
  stream.reserve(dense.size() * sizeof(Sha256));
  for (const auto& [name, hash] : dense) stream.insert(stream.end(), hash.begin(), hash.end());
  const Sha256 digest = sha256(stream.data(), stream.size());
  std::string hex;
  for (unsigned char b : digest) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace zs::engine
