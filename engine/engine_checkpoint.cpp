// Engine::save_checkpoint / load_checkpoint / wait_checkpoint: the engine's model states through the
// storage layer of checkpoint (docs/checkpoints.md). What each rank writes and reads:
// engine_checkpoint_items.cpp (Note [checkpoint buffers]).
#include <fmt/ranges.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/clock.h"
#include "core/errors.h"
#include "core/log.h"
#include "checkpoint/h5.h"
#include "comm/agree.h"
#include "engine/detail/engine_checkpoint.h"
#include "engine/detail/engine_impl.h"  // Engine::checkpoint_access only
#include "nn/threads.h"

namespace zs::engine {

namespace fs = std::filesystem;
using memory::DType;
using memory::ShardRange;
using memory::Tier;

namespace {

constexpr const char* k16BitFile = "zs_model_16bit.h5";

// Note [async writer priority]: the background writer of an asynchronous save (and the prune
// thread, Note [background prune]) runs at SCHED_IDLE, so it takes only CPU time the training
// threads leave idle (waits in communication, the optimizer's memory-bound passes, the gaps between
// steps) instead of a fair share of the cores they use: on a 2-core machine whose two training
// threads are busy, a normal-priority writer took a third of a core from them for the whole write.
// Tried and dropped: nice 19 instead (so that other users' niced jobs, which come before a
// SCHED_IDLE thread, no longer stretch the write to 0.7-1.0 s on a shared machine): the write was
// done before every commit, but in two of three runs the steps it overlapped ran 11-12% slower
// (paired rounds of benchmarks/checkpoint_async_bench; the third 0.99x), as the kernel's EEVDF
// scheduler preempts a SCHED_IDLE thread at once when a training thread wakes, while a nice-19 one
// may keep the core for the rest of its slice, at every wake-up of the worker pool. If the training
// never leaves a core idle, the write finishes when the commit waits for it and costs what a
// synchronous save costs at that point, never more. A thread that polls with sched_yield stays
// runnable and so counts as busy: the worker pool's caller no longer does (Note [pool waits] in
// core/parallel.cpp), OpenBLAS's threads still do for a while after each product. Only this
// thread's policy changes (Linux applies it per thread); a system that refuses it leaves the writer
// at normal priority. When the engine waits for the thread (the commit), it goes back to normal
// priority: the caller is blocked on it, and at SCHED_IDLE it would get nothing while any other
// process wants the cores (where the process may: leaving SCHED_IDLE needs root, CAP_SYS_NICE or
// RLIMIT_NICE).
void set_writer_priority(pthread_t thread, bool idle) {
  sched_param param{};
  if (pthread_setschedparam(thread, idle ? SCHED_IDLE : SCHED_OTHER, &param) != 0) {
    ZS_LOG_DEBUG("checkpoint: could not change the background writer's scheduling policy");
  }
}

// Note [async snapshot]: an asynchronous save copies this rank's items into host memory before it
// returns. That memory was allocated afresh at every save and freed piece by piece as the writer
// went; on this project's paravirtualised VM the first touch of each fresh 4 KiB page (a fault, a
// zeroed page) made the copy of a 37 MiB snapshot take 0.13-0.17 s on the training thread, ten times
// the copy itself (benchmarks/checkpoint_async_bench, docs/benchmarks.md). The engine now keeps one
// snapshot mapping from the first asynchronous save on and reuses it (host memory: this rank's share
// of the saved states, held for the engine's life once an asynchronous save ran; a save that needs
// more maps a larger one and drops the old), and asks for transparent huge pages on it so the first
// save faults 2 MiB at a time. The next save can reuse it because it commits the previous one (and
// so joins its writer) before it copies anything.
constexpr size_t kSnapshotAlignment = 64;  // bytes: each item's copy starts on a cache line

}  // namespace

std::shared_ptr<CheckpointSnapshot> EngineCheckpoint::snapshot_memory(size_t bytes) {
  std::shared_ptr<CheckpointSnapshot>& kept = a_.snapshot;
  if (kept && kept->bytes.capacity() >= bytes) return kept;
  kept.reset();  // unmapped before the larger one is mapped
  kept = std::make_shared<CheckpointSnapshot>();
  kept->bytes = offload::AlignedBuffer(std::max<size_t>(bytes, 1));
#ifdef MADV_HUGEPAGE
  ::madvise(kept->bytes.data(), kept->bytes.capacity(), MADV_HUGEPAGE);  // advice: a refusal changes nothing
#endif
  return kept;
}

namespace {

// The tensor-parallel degree that wrote a checkpoint: 1 for one written before it was recorded.
int64_t saved_tensor_parallel(const checkpoint::Metadata& m) {
  const checkpoint::Scalar v = scalar_or(m, "tensor_parallel_size", int64_t{1});
  return std::holds_alternative<int64_t>(v) ? std::get<int64_t>(v) : 1;
}

// Whether the optimizer named `saved` (a checkpoint's optimizer.type) drives compressed communication.
bool compressed_type(std::string_view saved) {
  const optim::OptimizerType* t = optim::find_optimizer_type(saved);
  return t != nullptr && t->compressed().has_value();
}

}  // namespace

std::string EngineCheckpoint::save(const fs::path& root, std::string tag) {
  if (a_.micro_step != 0 || a_.forward_pending) {
    throw UsageError(fmt::format("Engine::save_checkpoint in the middle of an accumulation window ({} of {} micro-batches "
                                 "run): save after step() has returned true",
                                 a_.micro_step, a_.config.batch.gradient_accumulation_steps));
  }
  finish_pending();
  const double call_t0 = now_seconds(), call_cpu0 = thread_cpu_seconds();
  if (tag.empty()) tag = fmt::format("global_step{}", a_.global_step);
  const CheckpointConfig& cc = a_.config.checkpoint;
  std::vector<Item> mine;
  // Agreed: a slice whose packed states cannot be stored is refused on the ranks that hold it.
  ranks_.agreed([&] { mine = items(Purpose::kSave); });
  // One gather: every rank's items (the layout), rank 0's tag and run id, and each rank's tag.
  std::string run_id = ranks_.rank() == 0 ? checkpoint::new_run_id() : std::string();
  const std::vector<std::string> all = ranks_.allgather(fmt::format("{}\n{}\n{}", tag, run_id, describe(mine)));
  std::vector<std::string> descriptions;
  std::vector<std::string> tags;
  for (const std::string& d : all) {
    const size_t a = d.find('\n'), b = d.find('\n', a + 1);
    tags.push_back(d.substr(0, a));
    if (run_id.empty() && &d == &all.front()) run_id = d.substr(a + 1, b - a - 1);
    descriptions.push_back(d.substr(b + 1));
  }
  // checkpoint.tag_validation (DeepSpeed's): every rank must name the same tag; the save uses rank 0's.
  auto differs = std::find_if(tags.begin(), tags.end(), [&](const std::string& t) { return t != tags.front(); });
  if (differs != tags.end() && cc.tag_validation != TagValidation::kIgnore) {
    const std::string what = fmt::format("checkpoint tag '{}' on rank {} differs from rank 0's '{}'", *differs,
                                         differs - tags.begin(), tags.front());
    if (cc.tag_validation == TagValidation::kFail) {
      throw CheckpointError(fmt::format("{} (checkpoint.tag_validation is \"Fail\"): pass every rank the same tag", what));
    }
    if (ranks_.rank() == 0) ZS_LOG_WARN("{}; saving under rank 0's tag (checkpoint.tag_validation \"Warn\")", what);
  }
  tag = tags.front();

  checkpoint::Metadata meta;
  meta.run_id = run_id;
  meta.tag = tag;
  meta.layout = build_layout(descriptions);
  meta.scalars = scalars();
  meta.config_json = a_.config.json;
  // finish_pending committed an asynchronous save, whose prune may still run (Note [background prune]):
  // begin_save leaves its directories to it.
  const std::shared_ptr<PendingCheckpoint> prune = a_.pending;
  std::span<const fs::path> pruning;
  if (prune && prune->prune_only) pruning = prune->pruning;
  fs::path staging;
  ranks_.agreed([&] {
    if (ranks_.rank() == 0) staging = checkpoint::begin_save(root, tag, pruning);
  });
  staging = ranks_.allgather(staging.string()).front();
  if (cc.async) {
    auto pending = std::make_shared<PendingCheckpoint>();
    pending->root = root;
    pending->staging = staging;
    pending->meta = meta;
    pending->rank = ranks_.rank();
    // The snapshot: the states may change as soon as this returns.
    ranks_.agreed([&] {
      size_t total = 0;
      for (const Item& it : mine) {
        pending->snapshot.push_back({it.buffer, total, it.count * memory::dtype_size(it.buffer_dtype)});
        total += (pending->snapshot.back().size + kSnapshotAlignment - 1) / kSnapshotAlignment * kSnapshotAlignment;
      }
      pending->host = snapshot_memory(total);
      std::byte* base = pending->host->bytes.data();
      memory::DeviceAccess access(a_.backend);
      for (size_t i = 0; i < mine.size(); ++i) {
        const Item& it = mine[i];
        const size_t elem = memory::dtype_size(it.buffer_dtype);
        std::byte* dst = base + pending->snapshot[i].offset;
        for_each_piece(it.count, [&](uint64_t at, uint64_t n) { it.io(at, n, dst + at * elem); });
      }
    });
    PendingCheckpoint* p = pending.get();
    // Rank 0's metadata file needs no other rank's file: its writer writes it too, off the
    // training thread (the commit's part is then the renames and `latest`).
    p->metadata_written = p->rank == 0;
    pending->writer = std::thread([p] {
      Engine::AsyncSaveTimes& t = p->times;
      try {
        double at = now_seconds();
        checkpoint::ShardWriter w(p->staging, p->meta, p->rank, checkpoint::WriteOptions{});
        t.write_create_s = now_seconds() - at;
        at = now_seconds();
        for (const PendingCheckpoint::Piece& piece : p->snapshot) {
          w.append(piece.buffer, std::span<const std::byte>(p->host->bytes.data() + piece.offset, piece.size));
        }
        t.write_data_s = now_seconds() - at;
        at = now_seconds();
        w.finish();
        if (p->metadata_written) checkpoint::write_metadata(p->staging, p->meta);
        t.write_finish_s = now_seconds() - at;
      } catch (const CheckpointError& e) {
        p->error_kind = kCheckpointError, p->error = e.what();
      } catch (const IoError& e) {
        p->error_kind = kIoError, p->error = e.what();
      } catch (const std::exception& e) {
        p->error_kind = kIoError, p->error = e.what();
      }
      t.writer_cpu_s = thread_cpu_seconds();
    });
    // Set here, not by the thread itself, so it cannot come after finish_pending's reset.
    set_writer_priority(pending->writer.native_handle(), true);
    pending->times.save_call_s = now_seconds() - call_t0;
    pending->times.save_call_cpu_s = thread_cpu_seconds() - call_cpu0;
    a_.pending = std::move(pending);
    ZS_LOG_INFO("checkpoint: step {} copied to host memory; writing {} in the background", a_.global_step,
                (root / tag).string());
    return tag;
  }
  ranks_.agreed([&] {
    // The training thread waits for this save: its compute threads hash while it writes (the
    // background writer above keeps to one thread).
    checkpoint::ShardWriter w(staging, meta, ranks_.rank(), checkpoint::WriteOptions{.hash_threads = nn::compute_threads()});
    std::vector<std::byte> piece;
    memory::DeviceAccess access(a_.backend);
    for (const Item& it : mine) {
      const size_t elem = memory::dtype_size(it.buffer_dtype);
      for_each_piece(it.count, [&](uint64_t at, uint64_t n) {
        piece.resize(n * elem);
        it.io(at, n, piece.data());
        w.append(it.buffer, piece);
      });
    }
    w.finish();
  });
  commit(root, staging, meta, false);
  return tag;
}

void EngineCheckpoint::commit(const fs::path& root, const fs::path& staging, const checkpoint::Metadata& meta,
                              bool metadata_written) {
  const CheckpointConfig& cc = a_.config.checkpoint;
  std::vector<fs::path> pruned;
  ranks_.agreed([&] {
    if (ranks_.rank() != 0) return;
    if (!metadata_written) checkpoint::write_metadata(staging, meta);
    if (cc.gather_16bit_weights) write_16bit(staging);
    checkpoint::commit_save(root, meta.tag, static_cast<int>(cc.keep_last), &pruned);
  });
  // Note [background prune]: the tags beyond keep_last are out of sight (renamed); a thread of rank
  // 0 removes their files while training goes on, joined like a writer by the next save, load or
  // wait_checkpoint (no collective: only rank 0 has one) or the engine's end; an asynchronous save's
  // commit runs inside the next save, whose begin_save then leaves the prune's directories to it. A
  // removal that fails is a warning: the save it follows is committed, and a later begin_save clears
  // what is left.
  if (!pruned.empty()) {
    auto prune = std::make_shared<PendingCheckpoint>();
    prune->prune_only = true;
    PendingCheckpoint* p = prune.get();
    prune->pruning = std::move(pruned);
    prune->writer = std::thread([p] {
      for (const fs::path& dir : p->pruning) {
        std::error_code ec;
        fs::remove_all(dir, ec);
        if (ec && p->error.empty()) p->error = fmt::format("removal of '{}': {}", dir.string(), ec.message());
      }
    });
    set_writer_priority(prune->writer.native_handle(), true);
    a_.pending = std::move(prune);
  }
  ZS_LOG_INFO("checkpoint: saved step {} to {} (tag {}, {} rank file(s))", std::get<int64_t>(meta.scalars.at("global_step")),
              (root / meta.tag).string(), meta.tag, ranks_.size());
}

void EngineCheckpoint::finish_pending() {
  std::shared_ptr<PendingCheckpoint> p = std::move(a_.pending);
  if (!p) return;
  if (p->prune_only) {  // Note [background prune]
    set_writer_priority(p->writer.native_handle(), false);
    p->writer.join();
    if (!p->error.empty()) ZS_LOG_WARN("checkpoint: an old tag beyond keep_last was not removed: {}", p->error);
    return;
  }
  const double t0 = now_seconds(), cpu0 = thread_cpu_seconds();
  set_writer_priority(p->writer.native_handle(), false);
  p->writer.join();
  const double t1 = now_seconds();
  ranks_.agreed([&] {
    switch (p->error_kind) {
      case kNoError: return;
      case kCheckpointError: throw CheckpointError(p->error);
      default: throw IoError(p->error);
    }
  });
  commit(p->root, p->staging, p->meta, p->metadata_written);
  Engine::AsyncSaveTimes& t = p->times;
  t.commit_wait_s = t1 - t0;
  t.commit_s = now_seconds() - t1;
  t.commit_cpu_s = thread_cpu_seconds() - cpu0;
  a_.last_async_save = t;
  ZS_LOG_DEBUG("checkpoint: background write: create {:.3f} s, data {:.3f} s, close and fsync {:.3f} s, {:.3f} s of "
               "CPU; waited for {:.3f} s at the commit, which took {:.3f} s",
               t.write_create_s, t.write_data_s, t.write_finish_s, t.writer_cpu_s, t.commit_wait_s, t.commit_s);
}

void EngineCheckpoint::write_16bit(const fs::path& dir) const {
  // DeepSpeed's 16-bit model file (stage3_gather_16bit_weights_on_model_save): every parameter whole,
  // by name, in the training dtype, one parameter at a time (memory: the largest parameter).
  checkpoint::CheckpointReader r = checkpoint::CheckpointReader::open_dir(dir);
  const checkpoint::Layout& layout = r.metadata().layout;
  const char* buffer = layout.find_buffer(kCkptParams) != nullptr ? kCkptParams : kCkptMaster;
  const DType dtype = layout.find_buffer(buffer)->dtype;
  const fs::path path = dir / k16BitFile;
  namespace h5 = checkpoint::h5;
  h5::Handle file = h5::file_create(path);
  h5::Handle lcpl = h5::plist_create(H5P_LINK_CREATE);
  ZS_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1), path, "link create list");
  h5::write_attr(file.get(), "dtype", memory::dtype_name(dtype), path);
  std::vector<std::byte> values;
  for (const checkpoint::TensorInfo& t : layout.tensors) {
    if (!r.holds(buffer, t.name) || !r.holds(kCkptMaster, t.name)) continue;  // a parameter, not an optimizer state
    values.resize(t.numel() * memory::dtype_size(dtype));
    r.read(buffer, t.name, 0, t.numel(), dtype, values.data());
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::Handle space = h5::dataspace_simple(dims);
    const hid_t type = dtype == DType::kF32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT16;  // bf16/fp16: their bit patterns
    h5::Handle ds(ZS_H5_CHECK(H5Dcreate2(file.get(), t.name.c_str(), type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                              path, fmt::format("create of dataset '{}'", t.name)),
                  H5Dclose);
    ZS_H5_CHECK(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), path,
                fmt::format("write of '{}'", t.name));
  }
  file.close(path, "file");
  checkpoint::fsync_path(path);
}

void EngineCheckpoint::check_compatible(const checkpoint::CheckpointReader& r) const {
  const checkpoint::Metadata& m = r.metadata();
  const fs::path& dir = r.dir();
  const checkpoint::Layout& layout = m.layout;
  // Every parameter this rank holds: present, with the model's shape.
  for (const auto& set : a_.sets) {
    for (const ParamSlot& slot : set->layout.slots()) {
      const std::string name = slot.param->full_name();
      const int t = layout.find_tensor(name);
      if (t < 0 || !r.holds(kCkptMaster, name)) {
        throw CheckpointError(fmt::format("checkpoint '{}' has no parameter '{}' of this model (it holds {} tensors, e.g. "
                                          "'{}'): a checkpoint of another model?",
                                          dir.string(), name, layout.tensors.size(),
                                          layout.tensors.empty() ? "" : layout.tensors.front().name));
      }
      // The checkpoint holds the full tensor (Note [tensor-parallel checkpoints]); this rank's slice of
      // it is read whatever tp degree wrote it.
      const std::vector<uint64_t> want = full_shape_of(*slot.param);
      const std::vector<uint64_t>& have = layout.tensors[static_cast<size_t>(t)].shape;
      if (have != want) {
        const nn::TensorSlice& ts = slot.param->tensor_slice();
        const std::string sliced =
            ts.whole() ? std::string()
                       : fmt::format(" (this rank's slice {}: piece {} of {} along dim {}, stride {})",
                                     shape_text(shape_of(slot.param->shape())), ts.index, ts.parts, ts.dim, ts.stride);
        throw CheckpointError(fmt::format("checkpoint '{}': parameter '{}' has shape {} there but {} in this model{}; "
                                          "checkpoints hold full tensors at any tp degree (this one was saved at tp "
                                          "{}), so the shapes must agree: a checkpoint of another model?",
                                          dir.string(), name, shape_text(have), shape_text(want), sliced,
                                          saved_tensor_parallel(m)));
      }
    }
  }
  const std::string saved = string_scalar(m, "optimizer.type");
  const std::string_view ours = a_.config.optimizer.name();
  if (!a_.config.optimizer.can_resume_from(saved)) {
    throw CheckpointError(fmt::format("checkpoint '{}' holds {} optimizer states, which {} cannot continue from (its "
                                      "states differ); load it with optimizer.type {}",
                                      dir.string(), saved.empty() ? "unknown" : saved, ours, saved));
  }
  // Every state this rank's optimizer needs, for every parameter it holds.
  std::vector<std::string> needed;
  if (a_.compressed) {
    needed = {kCkptMomentum, kCkptVariance};
  } else {
    for (const auto& spec : a_.specs) needed.emplace_back(spec.name);
  }
  for (const std::string& b : needed) {
    if (layout.find_buffer(b) == nullptr) {
      throw CheckpointError(fmt::format("checkpoint '{}' has no optimizer state '{}', which {} needs", dir.string(), b, ours));
    }
  }
}

void EngineCheckpoint::restore_scalars(const checkpoint::Metadata& m, const fs::path& dir) {
  a_.global_step = int_scalar(m, "global_step", dir);
  a_.steps_taken = int_scalar(m, "steps_taken", dir);
  if (a_.config.precision == Precision::kFp16 && string_scalar(m, "precision") == "fp16") {
    a_.scaler.set_state({.scale = real_scalar(m, "loss_scaler.scale", dir),
                          .hysteresis_left = int_scalar(m, "loss_scaler.hysteresis_left", dir),
                          .good_steps = int_scalar(m, "loss_scaler.good_steps", dir),
                          .overflows = int_scalar(m, "loss_scaler.overflows", dir)});
  } else if (string_scalar(m, "precision") == precision_name(a_.config.precision)) {
    // bf16 and fp32 keep their configured (static) scale; the counters still go on from the save,
    // so a resumed run's checkpoint equals an uninterrupted run's (`zeroshard checkpoint compare`).
    optim::LossScaler::State st = a_.scaler.state();
    st.good_steps = int_scalar(m, "loss_scaler.good_steps", dir);
    st.overflows = int_scalar(m, "loss_scaler.overflows", dir);
    a_.scaler.set_state(st);
  }
  if (!a_.compressed) return;
  CompressedState& c = *a_.compressed;
  // A momentum gathered before the save (the compressed phase) is whole here too; one still sharded
  // is gathered at the first compressed step, as in a run never interrupted.
  const bool whole = compressed_source_ && int_scalar(m, "compressed.momentum_whole", dir) != 0;
  c.momentum_whole = whole || a_.stage == 0 || a_.group.size() == 1;
  if (c.schedule) {
    if (m.scalars.count("zero_one.step") != 0) {
      c.schedule->set_state({.step = int_scalar(m, "zero_one.step", dir),
                             .var_interval = int_scalar(m, "zero_one.var_interval", dir),
                             .var_counter = int_scalar(m, "zero_one.var_counter", dir),
                             .local_step_interval = int_scalar(m, "zero_one.local_step_interval", dir),
                             .local_step_counter = int_scalar(m, "zero_one.local_step_counter", dir),
                             .lrs = real_scalar(m, "zero_one.lrs", dir)});
    } else {
      // From Adam or one-bit Adam: the schedule restarts its bookkeeping at the loaded step.
      c.schedule->set_state({.step = a_.steps_taken});
    }
  }
  if (!rank_local_ok_) c.reduce->reset_errors();
}

std::string EngineCheckpoint::load(const fs::path& root, const std::string& tag) {
  if (a_.micro_step != 0 || a_.forward_pending) {
    throw UsageError(fmt::format("Engine::load_checkpoint in the middle of an accumulation window ({} of {} micro-batches "
                                 "run): load before training, or after step() has returned true",
                                 a_.micro_step, a_.config.batch.gradient_accumulation_steps));
  }
  finish_pending();  // a save still being written is committed first: it may be the one to load
  std::optional<checkpoint::CheckpointReader> reader;
  // 1. Open and check (nothing in the engine changes yet).
  ranks_.agreed([&] {
    reader.emplace(root, tag);
    check_compatible(*reader);
    const checkpoint::Metadata& m = reader->metadata();
    const std::string saved = string_scalar(m, "optimizer.type");
    const int64_t saved_tp = saved_tensor_parallel(m);
    compressed_source_ = compressed_type(saved);
    rank_local_ok_ = a_.compressed && compressed_source_ &&
                     int_scalar(m, "world_size", reader->dir()) == ranks_.size() && saved_tp == ranks_.tp_size() &&
                     std::get<int64_t>(scalar_or(m, "compressed.flat_elements", int64_t{-1})) ==
                         static_cast<int64_t>(dense().layout.total()) &&
                     std::get<int64_t>(scalar_or(m, "compressed.rank_local_states", int64_t{0})) ==
                         static_cast<int64_t>(!a_.compressed->accumulator.empty());
    // A rank file lost since the save: rank-local states need this rank's own tensors. And they must be
    // this run's sizes: optimizer.params.compression_scale changed between save and load ("block" and
    // "tensor" keep error feedback of different lengths) restarts the error feedback at zero, as a new
    // world size does.
    auto fits = [&](const char* name, size_t numel) {
      const std::string tensor = fmt::format("{}.rank{}", name, ranks_.rank());
      const int k = m.layout.find_tensor(tensor);
      return k >= 0 && m.layout.tensors[static_cast<size_t>(k)].numel() == numel &&
             reader->holds(kCkptErrorFeedback, tensor);
    };
    if (rank_local_ok_ && !(fits("error_feedback.worker", a_.compressed->reduce->worker_error().size()) &&
                            fits("error_feedback.server", a_.compressed->reduce->server_error().size()))) {
      rank_local_ok_ = false;
    }
  });
  const checkpoint::Metadata& m = reader->metadata();
  const fs::path dir = reader->dir();
  // 2. Read this rank's ranges of every state, re-sliced by name (Note [checkpoint buffers]). Stage 3
  // on one node: the peers read the parameter shards in place (Note [one-sided parameter gathers] in
  // engine/detail/param_gatherer.h); written once they are done, a new version either way.
  for (const auto& set : a_.sets) {
    if (set->gatherer) set->gatherer->begin_shard_write();
  }
  struct NewVersion {
    const CheckpointAccess& a;
    bool done = false;
    ~NewVersion() {  // a failed read left the shards partly written: a new version all the same
      if (done) return;
      memory::DeviceAccess access(a.backend);
      for (const auto& set : a.sets) {
        if (set->gatherer) set->gatherer->shards_written();
      }
    }
  } new_version{a_};
  ranks_.agreed([&] {
    std::vector<Item> wanted = items(Purpose::kLoad);
    std::vector<std::byte> piece;
    memory::DeviceAccess access(a_.backend);
    for (const Item& it : wanted) {
      const size_t elem = memory::dtype_size(it.buffer_dtype);
      for_each_piece(it.count, [&](uint64_t at, uint64_t n) {
        piece.resize(n * elem);
        reader->read(it.buffer, it.tensor, it.begin + at, n, it.buffer_dtype, piece.data());
        it.io(at, n, piece.data());
      });
    }
  });
  // The counters only once every rank has read its data, so that no rank moves on alone.
  ranks_.agreed([&] { restore_scalars(m, dir); });
  // 3. The parameters every rank holds from the loaded states, the gradients zeroed
  // (CheckpointAccess::loaded, Engine::checkpoint_access; it publishes the shards' new version).
  new_version.done = true;
  a_.loaded();
  const std::string saved_optimizer = string_scalar(m, "optimizer.type");
  if (ranks_.rank() == 0) {
    if (compressed_source_ && !a_.compressed) {
      ZS_LOG_INFO("checkpoint: {}'s error-feedback buffers are dropped: {} keeps none, and continues from the "
                  "checkpoint's exp_avg and exp_avg_sq",
                  saved_optimizer, a_.config.optimizer.name());
    } else if (compressed_source_ && !rank_local_ok_) {
      ZS_LOG_INFO("checkpoint: {}'s error-feedback buffers and rank-local momenta (saved at {} rank(s)) do not fit "
                  "this run ({} at {} rank(s)): the error feedback restarts at zero and the momentum is the saved "
                  "owners' copy",
                  saved_optimizer, int_scalar(m, "world_size", dir), a_.config.optimizer.name(), ranks_.size());
    }
    ZS_LOG_INFO("checkpoint: loaded {} (step {}, saved at {} rank(s), tp {}, ZeRO stage {}) at {} rank(s), tp {}, ZeRO "
                "stage {}",
                dir.string(), a_.global_step, int_scalar(m, "world_size", dir), saved_tensor_parallel(m),
                int_scalar(m, "zero.stage", dir), ranks_.size(), ranks_.tp_size(), a_.stage);
  }
  return m.tag;
}

std::string Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
  return EngineCheckpoint(checkpoint_access()).save(dir, tag);
}

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  return EngineCheckpoint(checkpoint_access()).load(dir, tag);
}

void Engine::wait_checkpoint() { EngineCheckpoint(checkpoint_access()).finish_pending(); }

CheckpointAccess Engine::checkpoint_access() {
  Impl& s = *impl_;
  return CheckpointAccess{.config = config_,
                          .group = group_,
                          .tensor_parallel = tp_,
                          .pipeline_parallel = pipeline_parallel(),
                          .copies = &s.env_.uncounted,
                          .sets = s.sets_,
                          .compressed = s.compressed_ ? &*s.compressed_ : nullptr,
                          .specs = s.env_.specs,
                          .dtype = s.dtype_,
                          .stage = s.stage_,
                          .backend = *s.backend_,
                          .forward_pending = model_.forward_pending(),
                          .micro_step = s.micro_step_,
                          .global_step = global_step_,
                          .steps_taken = s.steps_taken_,
                          .scaler = s.scaler_,
                          .schedule = s.schedule_,
                          .snapshot = s.checkpoint_snapshot_,
                          .pending = pending_checkpoint_,
                          .last_async_save = last_async_save_,
                          .loaded = [this] {
                            // Stages 1-2 allgather the loaded shards; stage 3 drops what its gatherer
                            // holds (persistent modules included), so the next pass gathers the loaded values.
                            impl_->gather_updated_params();
                            for (auto& set : impl_->sets_) {
                              set->zero_grads();
                              set->zero_fp32_grads();
                            }
                            last_ = StepReport{};
                            last_.step = global_step_;
                          }};
}

}  // namespace zs::engine
