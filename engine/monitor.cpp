#include "engine/monitor.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <boost/json/serialize.hpp>
#include <boost/json/string.hpp>
#include <fmt/format.h>

#include "core/errors.h"
#include "core/log.h"
#include "engine/detail/event_file.h"

namespace zs::engine {
namespace {

namespace fs = std::filesystem;

// output_path/job_name, created; `key` is the section's JSON name for the message.
std::string make_output_dir(const MonitorOutputConfig& c, std::string_view key) {
  const fs::path dir = fs::path(c.output_path) / c.job_name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw IoError(fmt::format("{}.output_path: cannot create the directory '{}' ({}); set {}.output_path to a writable "
                              "directory",
                              key, dir.string(), ec ? ec.message() : "not a directory", key));
  }
  return dir.string();
}

std::string mib(size_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / (1 << 20)); }

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

bool TrainingMonitor::wanted(const EngineConfig& c) {
  const MonitorConfig& m = c.monitor;
  return m.csv.enabled || m.tensorboard.enabled || m.comms.enabled || m.memory_breakdown;
}

TrainingMonitor::TrainingMonitor(const EngineConfig& config, int rank) : config_(config), writer_(rank == 0), rank_(rank) {
  const MonitorConfig& m = config_.monitor;
  if (m.comms.enabled && !m.comms.trace_file.empty()) {
    trace_file_ = trace_file_of(m.comms.trace_file, rank);
    // Created now (its directory too, as csv_monitor's), so an unwritable path fails at start-up rather
    // than after the run.
    const fs::path parent = fs::path(trace_file_).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (!std::ofstream(trace_file_)) {
      throw IoError(fmt::format("comms_logger.trace_file: rank {} cannot write '{}' ({}); set comms_logger.trace_file to a "
                                "path in a writable directory",
                                rank, trace_file_, std::strerror(errno)));
    }
  }
  if (!writer_) return;
  if (m.csv.enabled) {
    csv_dir_ = make_output_dir(m.csv, "csv_monitor");
    // Probe now, so a read-only directory fails at start-up rather than at step 1.
    const std::string probe = (fs::path(csv_dir_) / ".zeroshard_write_test").string();
    if (!std::ofstream(probe)) {
      throw IoError(fmt::format("csv_monitor.output_path: cannot write in '{}' ({}); set csv_monitor.output_path to a "
                                "writable directory",
                                csv_dir_, std::strerror(errno)));
    }
    fs::remove(probe);
  }
  if (m.tensorboard.enabled) {
    const std::string dir = make_output_dir(m.tensorboard, "tensorboard");
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    // SummaryWriter's naming, so TensorBoard's directory scan picks the file up.
    const std::string name = fmt::format("events.out.tfevents.{}.{}.{}", std::chrono::duration_cast<std::chrono::seconds>(now).count(),
                                         host_name(), getpid());
    tensorboard_ = std::make_unique<detail::EventFile>((fs::path(dir) / name).string(), "tensorboard.output_path");
  }
}

TrainingMonitor::~TrainingMonitor() = default;

const std::string& TrainingMonitor::tensorboard_file() const {
  static const std::string kNone;
  return tensorboard_ ? tensorboard_->path() : kNone;
}

std::vector<std::pair<std::string, double>> TrainingMonitor::events(const MonitorSample& s) const {
  std::vector<std::pair<std::string, double>> e;
  e.emplace_back("Train/Samples/train_loss", s.loss);
  e.emplace_back("Train/Samples/lr", s.lr);
  if (config_.precision == Precision::kFp16) e.emplace_back("Train/Samples/loss_scale", s.loss_scale);
  if (config_.wall_clock_breakdown) {
    e.emplace_back("Train/Samples/elapsed_time_ms_forward", s.forward_s * 1e3);
    e.emplace_back("Train/Samples/elapsed_time_ms_backward", s.backward_s * 1e3);
    e.emplace_back("Train/Samples/elapsed_time_ms_step", s.optimizer_s * 1e3);
  }
  if (s.step_s > 0) {
    e.emplace_back("Train/Samples/samples_per_second", static_cast<double>(s.step_samples) / s.step_s);
    if (s.step_tokens > 0) e.emplace_back("Train/Samples/tokens_per_second", static_cast<double>(s.step_tokens) / s.step_s);
  }
  const auto device = static_cast<size_t>(memory::Tier::kDevice);
  e.emplace_back("Train/Samples/device_memory_bytes", static_cast<double>(s.memory.tier_current[device]));
  e.emplace_back("Train/Samples/device_memory_peak_bytes", static_cast<double>(s.memory.tier_peak[device]));
  return e;
}

void TrainingMonitor::write_csv(const std::string& name, int64_t step, double value) {
  std::string file = name;
  std::replace(file.begin(), file.end(), '/', '_');
  std::replace(file.begin(), file.end(), ' ', '_');
  const std::string path = (fs::path(csv_dir_) / (file + ".csv")).string();
  // DeepSpeed appends (a rerun into the same job_name continues its files) and writes the header the
  // first time this run writes the event.
  std::ofstream out(path, std::ios::app);
  const bool first = std::find(csv_started_.begin(), csv_started_.end(), name) == csv_started_.end();
  if (first) {
    csv_started_.push_back(name);
    out << "step," << name.substr(name.rfind('/') + 1) << '\n';
  }
  // fmt's shortest round-trip form, as Python's csv module writes a float.
  out << step << ',' << fmt::format("{}", value) << '\n';
  if (!out) {
    throw IoError(fmt::format("csv_monitor.output_path: cannot write '{}' ({}); set csv_monitor.output_path to a "
                              "writable directory",
                              path, std::strerror(errno)));
  }
}

void TrainingMonitor::on_step(const MonitorSample& s, const std::vector<comm::OpStats>& ops) {
  if (!writer_) return;
  last_step_ = s.step;
  ops_at_last_step_ = ops;
  const MonitorConfig& m = config_.monitor;
  if (m.csv.enabled || tensorboard_) {
    const auto ev = events(s);
    if (m.csv.enabled) {
      for (const auto& [name, value] : ev) write_csv(name, s.samples, value);
    }
    if (tensorboard_) {
      const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      tensorboard_->add_scalars(s.samples, wall, ev);
    }
  }
  if (s.step == 1 || s.step % config_.steps_per_print == 0 || s.step == config_.train_steps) {
    // The arena's reserved bytes (allocated plus the holes inside its pools' regions): what a leak or
    // fragmentation that grows over a long run shows up in (tests/faults/long_run.py).
    if (m.memory_breakdown) {
      ZS_LOG_INFO("step {} {}; device arena reserved {} bytes", s.step, memory_breakdown_line(s.memory),
                  s.device_reserved_bytes);
    }
    if (m.comms.enabled && m.comms.verbose) ZS_LOG_INFO("step {} collectives so far:\n{}", s.step, comms_table(ops, m.comms));
  }
}

void TrainingMonitor::finish(const std::vector<comm::OpStats>& ops, const std::vector<comm::TraceEvent>& trace) {
  if (finished_) return;
  finished_ = true;
  if (!trace_file_.empty()) {
    std::ofstream out(trace_file_, std::ios::trunc);
    out << chrome_trace(trace, rank_);
    out.close();
    if (!out) throw IoError(fmt::format("comms_logger.trace_file: rank {} could not write '{}'", rank_, trace_file_));
    ZS_LOG_INFO("comms_logger: {} collectives traced to {}", trace.size(), trace_file_);
  }
  if (!writer_) return;
  const CommsLoggerConfig& c = config_.monitor.comms;
  if (!c.enabled) return;
  ZS_LOG_INFO("collectives of this run (rank 0):\n{}", comms_table(ops, c));
  const std::vector<comm::OpStats> after = comm::ops_since(ops, ops_at_last_step_);
  if (!after.empty() && last_step_ > 0) {
    ZS_LOG_INFO("of them after step {} (the summary's parameter digest, a final checkpoint):\n{}", last_step_,
                comms_table(after, c));
  }
}


std::string memory_breakdown_line(const memory::MemorySnapshot& s) {
  std::string line;
  for (memory::Tier t : {memory::Tier::kDevice, memory::Tier::kHost, memory::Tier::kNvme}) {
    const auto ti = static_cast<size_t>(t);
    if (t != memory::Tier::kDevice && s.tier_peak[ti] == 0) continue;  // no offload: nothing there
    if (!line.empty()) line += "; ";
    line += fmt::format("{} {} MiB (peak {}) =", memory::tier_name(t), mib(s.tier_current[ti]), mib(s.tier_peak[ti]));
    const char* sep = " ";
    for (memory::Category c : memory::kAllCategories) {
      line += fmt::format("{}{} {} ({})", sep, memory::category_name(c), mib(s.at(c, t)), mib(s.peak_at(c, t)));
      sep = " | ";
    }
  }
  return "memory (MiB, current (peak)): " + line;
}

std::string trace_file_of(const std::string& pattern, int rank) {
  const std::string r = std::to_string(rank);
  if (const size_t at = pattern.find("{rank}"); at != std::string::npos) return std::string(pattern).replace(at, 6, r);
  const fs::path p(pattern);
  return (p.parent_path() / (p.stem().string() + ".rank" + r + p.extension().string())).string();
}

std::string chrome_trace(const std::vector<comm::TraceEvent>& events, int rank) {
  auto quoted = [](const std::string& s) { return boost::json::serialize(boost::json::string(s)); };
  std::string out = fmt::format(
      "{{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n"
      "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {0}, \"args\": {{\"name\": \"rank {0}\"}}}},\n"
      "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {0}, \"tid\": 0, \"args\": {{\"name\": \"calling thread\"}}}},\n"
      "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {0}, \"tid\": 1, \"args\": {{\"name\": \"comm worker\"}}}}",
      rank);
  for (const comm::TraceEvent& e : events) {
    out += fmt::format(
        ",\n{{\"name\": {}, \"cat\": {}, \"ph\": \"X\", \"pid\": {}, \"tid\": {}, \"ts\": {:.3f}, \"dur\": {:.3f}, "
        "\"args\": {{\"group\": {}, \"bytes_sent\": {}, \"bytes_inter_host\": {}}}}}",
        quoted(e.name), quoted(e.group), rank, e.on_worker ? 1 : 0, e.start_s * 1e6, e.seconds * 1e6, quoted(e.group),
        e.bytes_sent, e.bytes_inter_host);
  }
  out += "\n]}\n";
  return out;
}

std::string comms_table(const std::vector<comm::OpStats>& ops, const CommsLoggerConfig& c) {
  // A job spanning hosts adds the bytes that crossed between them (Note [Bytes across hosts] in
  // comm/config.h); on one host the table stays DeepSpeed's.
  const bool hosts = std::any_of(ops.begin(), ops.end(), [](const comm::OpStats& op) { return op.bytes_inter_host > 0; });
  std::string out = fmt::format("{:<16}{:>10}{:>16}{:>20}{:>18}{:>18}", "Comm. Op", "Count", "Bytes sent",
                                "Total Latency(ms)", "Avg Latency(ms)", "busbw (Gbps)");
  if (hosts) out += fmt::format("{:>20}", "Inter-host bytes");
  for (const comm::OpStats& op : ops) {
    if (!c.prof_all && std::find(c.prof_ops.begin(), c.prof_ops.end(), op.name) == c.prof_ops.end()) continue;
    const double total_ms = op.seconds * 1e3;
    const double gbps = op.seconds > 0 ? static_cast<double>(op.bytes_sent) * 8 / op.seconds / 1e9 : 0.0;
    out += fmt::format("\n{:<16}{:>10}{:>16}{:>20.3f}{:>18.3f}{:>18.3f}", op.name, op.count, op.bytes_sent, total_ms,
                       total_ms / static_cast<double>(op.count), gbps);
    if (hosts) out += fmt::format("{:>20}", op.bytes_inter_host);
  }
  return out;
}

}  // namespace zs::engine
