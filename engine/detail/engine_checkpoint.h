// EngineCheckpoint: the engine's side of Engine::save_checkpoint / load_checkpoint, shared by
// engine_checkpoint.cpp (save, commit, load, agreed errors) and engine_checkpoint_items.cpp (what each
// rank saves or loads, and the data movement of each piece: Note [checkpoint buffers] there).
// Internal: not installed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <unordered_set>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/detail/compressed_state.h"
#include "engine/detail/model_states.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "offload/aligned_buffer.h"

namespace zs::engine {

// The buffer names checkpoint files hold (Note [checkpoint buffers] in engine_checkpoint_items.cpp):
// part of the file format, so fixed whatever the engine calls its buffers (the plan's "master" is
// kCkptMaster, the compressed optimizers' "momentum" and "variance" are Adam's exp_avg, exp_avg_sq).
inline constexpr const char* kCkptMaster = "fp32";            // the fp32 master weights
inline constexpr const char* kCkptParams = "params";          // the training-dtype parameters (bf16/fp16)
inline constexpr const char* kCkptMomentum = "exp_avg";       // one-bit Adam / 0/1 Adam momentum
inline constexpr const char* kCkptVariance = "exp_avg_sq";    // one-bit Adam / 0/1 Adam variance
inline constexpr const char* kCkptErrorFeedback = "error_feedback";
inline constexpr const char* kCkptRankLocal = "rank_local";

// Elements a save or load moves at a time: 4 MiB of fp32.
inline constexpr uint64_t kCheckpointPieceElements = uint64_t{1} << 20;

// Calls f(at, n) for each piece [at, at + n) of `count` elements, in order, n <= kCheckpointPieceElements.
template <class F>
void for_each_piece(uint64_t count, F&& f) {
  for (uint64_t at = 0; at < count; at += kCheckpointPieceElements) {
    f(at, std::min(kCheckpointPieceElements, count - at));
  }
}

// One segment of one buffer: elements [begin, begin + count) of `tensor`, moved by `io`.
struct Item {
  std::string buffer;
  memory::DType buffer_dtype = memory::DType::kF32;
  std::string tensor;
  std::vector<uint64_t> shape;
  memory::DType tensor_dtype = memory::DType::kF32;
  uint64_t begin = 0;
  uint64_t count = 0;
  // Moves elements [begin + at, begin + at + n) between the engine and `host` (n elements of
  // buffer_dtype): save reads them out, load writes them in.
  std::function<void(uint64_t at, uint64_t n, void* host)> io;
};

// How an error crosses ranks (and the async writer's thread): its kind, then its message.
enum CheckpointErrorKind : int32_t { kNoError = 0, kCheckpointError, kIoError, kUsageError, kConfigError, kOtherError };

// The host memory an asynchronous save copies this rank's items into: one mapping, allocated at the
// first asynchronous save (grown when a later one needs more) and kept by the engine (its Impl) between saves,
// so that a save's copy writes to pages already mapped (Note [async snapshot] in engine_checkpoint.cpp).
struct CheckpointSnapshot {
  offload::AlignedBuffer bytes;
};

// An asynchronous save (checkpoint.async): this rank's snapshot, written by `writer`; committed by
// Engine::wait_checkpoint.
struct PendingCheckpoint {
  std::filesystem::path root;
  std::filesystem::path staging;
  checkpoint::Metadata meta;
  int rank = 0;
  // The snapshot (shared with the engine, which reuses it once this save is committed) and its
  // pieces: (buffer, bytes [offset, offset + size) of the snapshot) in file order.
  std::shared_ptr<CheckpointSnapshot> host;
  struct Piece {
    std::string buffer;
    size_t offset = 0;
    size_t size = 0;
  };
  std::vector<Piece> snapshot;
  std::thread writer;
  // Set by the writer thread, read after join (an exception crosses the thread as kind + message).
  int32_t error_kind = kNoError;
  std::string error;
  // Engine::AsyncSaveTimes: the save call's part, then the writer's (set by it, read after join).
  Engine::AsyncSaveTimes times;
  bool metadata_written = false;  // rank 0's writer also wrote the metadata file
  // Not a save: `writer` removes the tags a commit pruned (Note [background prune]), on rank 0 only.
  bool prune_only = false;
  std::vector<std::filesystem::path> pruning;  // prune_only: the directories `writer` removes
  ~PendingCheckpoint() {
    if (writer.joinable()) writer.join();
  }
};

// engine_checkpoint_layout.cpp: agreement across ranks and the storage layout.
// Every rank's string, in rank order. Collective.
std::vector<std::string> allgather_strings(const comm::Group& g, const std::string& mine);
// Runs `fn` on every rank and agrees on the outcome: when any rank threw, every rank throws the same
// error (the lowest failing rank's, of its kind, its message prefixed with that rank), so no rank is
// left waiting in a collective that the failed one never enters. Collective.
void agreed(const comm::Group& g, const std::function<void()>& fn);
std::string shape_text(const std::vector<uint64_t>& s);
// This rank's items as text, for the layout every rank builds from all of them.
std::string describe(const std::vector<Item>& items);
checkpoint::Layout build_layout(const std::vector<std::string>& descriptions);
// Scalars of a checkpoint's metadata: a missing or mistyped one is a CheckpointError naming it.
checkpoint::Scalar scalar_or(const checkpoint::Metadata& m, const std::string& key, checkpoint::Scalar fallback);
int64_t int_scalar(const checkpoint::Metadata& m, const std::string& key, const std::filesystem::path& dir);
double real_scalar(const checkpoint::Metadata& m, const std::string& key, const std::filesystem::path& dir);
std::string string_scalar(const checkpoint::Metadata& m, const std::string& key);

// The ranks of one checkpoint: the data-parallel group times the tensor-parallel group times the
// pipeline stages, in Megatron's rank order (tensor-parallel ranks consecutive, then data-parallel,
// then stages), so rank t + tp * (d + dp * s) of the checkpoint is tensor-parallel rank t of
// data-parallel rank d of stage s and writes zs_rank_<that>.h5 (at tp = pp = 1 the data-parallel
// rank, as before). Its collectives run over the groups in turn (no group of every rank is needed):
// Note [tensor-parallel checkpoints] in engine_checkpoint_items.cpp. Each stage writes and reads its
// own parameters by name, so a checkpoint resumes at any pp.
class CheckpointRanks {
 public:
  CheckpointRanks(const comm::Group& dp, const comm::Group* tp, const comm::Group* pp = nullptr)
      : dp_(dp), tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr), pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr) {}
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  int pp_size() const { return pp_ ? pp_->size() : 1; }
  int rank() const { return tp_rank() + tp_size() * (dp_.rank() + dp_.size() * (pp_ ? pp_->rank() : 0)); }
  int size() const { return tp_size() * dp_.size() * pp_size(); }
  // Every rank's string, by checkpoint rank. Collective.
  std::vector<std::string> allgather(const std::string& mine) const;
  // agreed() over every rank of the checkpoint; the message names the failing checkpoint rank. Collective.
  void agreed(const std::function<void()>& fn) const;

 private:
  std::vector<std::string> allgather_stage(const std::string& mine) const;  // over dp x tp
  void agreed_stage(const std::function<void()>& fn) const;

  const comm::Group& dp_;
  const comm::Group* tp_;
  const comm::Group* pp_;
};

// What the checkpoint code reaches of an engine, handed over by the engine (Engine::checkpoint_access;
// no friend access into Engine::Impl): the state owners, which it saves and loads through their
// public interface (Note [State owner] in engine/detail/model_states.h), the compressed optimizer's
// state, and the counters a checkpoint carries. Valid for one save, load or wait call.
struct CheckpointAccess {
  const EngineConfig& config;
  const comm::Group& group;                              // the data-parallel group
  // The tensor-parallel group (nullptr or one rank: tp = 1). Parameters with a TensorSlice are stored
  // at their places in the full tensor (Note [tensor-parallel checkpoints] in engine_checkpoint_items.cpp).
  const comm::Group* tensor_parallel = nullptr;
  // The "pp" group of a pipeline stage (nullptr: none), and the parameters this stage holds a copy of
  // that another stage writes (the tied head): read on load, not written.
  const comm::Group* pipeline_parallel = nullptr;
  const std::unordered_set<const nn::Parameter*>* copies = nullptr;
  std::span<const std::unique_ptr<ModelStates>> sets;    // [0]: dense; then the expert sets
  CompressedState* compressed = nullptr;                 // one-bit Adam / 0/1 Adam only
  std::span<const optim::StateSpec> specs;               // the elementwise optimizer's states
  memory::DType dtype = memory::DType::kF32;             // the training dtype
  int stage = 0;
  memory::Backend& backend;
  bool forward_pending = false;  // a forward() without its backward()
  int64_t micro_step = 0;        // micro-batches run in the current accumulation window
  int64_t& global_step;          // saved and restored
  int64_t& steps_taken;          // saved and restored
  optim::LossScaler& scaler;     // saved and restored
  const optim::LrSchedule& schedule;
  std::shared_ptr<CheckpointSnapshot>& snapshot;  // Note [async snapshot], kept by the engine
  std::shared_ptr<PendingCheckpoint>& pending;    // the asynchronous save (or prune) in flight
  Engine::AsyncSaveTimes& last_async_save;
  // After a load has restored the states: the engine's parameters from them, gradients zeroed.
  std::function<void()> loaded;
};

// The engine's side of a checkpoint: which items this rank saves or loads, and the data movement of
// each (through the state owners).
class EngineCheckpoint {
 public:
  explicit EngineCheckpoint(CheckpointAccess access)
      : a_(std::move(access)), ranks_(a_.group, a_.tensor_parallel, a_.pipeline_parallel) {}

  std::string save(const std::filesystem::path& root, std::string tag);
  std::string load(const std::filesystem::path& root, const std::string& tag);
  // Commits an asynchronous save (collective); nothing when none is pending.
  void finish_pending();

 private:
  enum class Purpose { kSave, kLoad };

  // Flat range of set `set` this rank writes (save) or holds (load).
  memory::ShardRange range_for(const ModelStates& set, Purpose p, bool whole_state) const {
    const memory::ShardRange held = whole_state ? set.whole() : set.step_range();
    if (p == Purpose::kLoad) return held;
    if (a_.stage == 0) return set.group.rank() == 0 ? held : memory::ShardRange{held.offset, 0};
    return whole_state ? set.partition.mine : held;
  }

  // fn(slot, part) for each slot of `set` overlapping `range`, with the overlap. A save leaves out
  // the parameters every tensor-parallel rank holds whole but the first's (each element is written once).
  template <typename F>
  void for_slots(const ModelStates& set, memory::ShardRange range, Purpose p, F&& fn) const {
    for (const ParamSlot& slot : set.layout.slots()) {
      if (p == Purpose::kSave && ranks_.tp_rank() != 0 && slot.param->tensor_slice().whole()) continue;
      if (p == Purpose::kSave && a_.copies != nullptr && a_.copies->contains(slot.param)) continue;
      memory::ShardRange part = slot.range().intersect(range);
      if (!part.empty()) fn(slot, part);
    }
  }
  // fn(flat, full, n) for each run of `part` (flat elements of `slot`) that is contiguous in the full
  // tensor: flat elements [flat, flat + n) are the full tensor's [full, full + n). One run at tp = 1.
  template <typename F>
  static void for_full_runs(const ParamSlot& slot, memory::ShardRange part, F&& fn) {
    slot.param->for_each_full_run(part.offset - slot.offset, part.size,
                                  [&](uint64_t local, uint64_t full, uint64_t n) { fn(slot.offset + local, full, n); });
  }

  std::vector<Item> items(Purpose p);
  void add_param_items(std::vector<Item>& out, ModelStates& set, Purpose p);
  void add_state_items(std::vector<Item>& out, ModelStates& set, Purpose p);
  void add_compressed_items(std::vector<Item>& out, Purpose p, bool rank_local);
  static std::vector<uint64_t> shape_of(const memory::Shape& s) { return {s.begin(), s.end()}; }
  static std::vector<uint64_t> full_shape_of(const nn::Parameter& p) { return shape_of(p.full_shape()); }
  std::map<std::string, checkpoint::Scalar> scalars() const;

  void check_compatible(const checkpoint::CheckpointReader& r) const;
  void restore_scalars(const checkpoint::Metadata& m, const std::filesystem::path& dir);
  void write_16bit(const std::filesystem::path& dir) const;
  // Rank 0 writes the metadata file (unless `metadata_written`: an async writer did), then commits;
  // the tags beyond keep_last are removed in the background (Note [background prune]).
  void commit(const std::filesystem::path& root, const std::filesystem::path& staging, const checkpoint::Metadata& meta,
              bool metadata_written);
  // The engine's kept snapshot memory when it holds at least `bytes`, else a new one it keeps instead.
  std::shared_ptr<CheckpointSnapshot> snapshot_memory(size_t bytes);

  ModelStates& dense() const { return *a_.sets.front(); }

  CheckpointAccess a_;
  CheckpointRanks ranks_;
  // Load: whether the checkpoint's rank-local states fit this run (same optimizer family and world).
  bool rank_local_ok_ = false;
  // Load: the checkpoint's compressed-optimizer states are read (else Adam-family states only).
  bool compressed_source_ = false;
};


}  // namespace zs::engine
