// The monitor sections end to end on one rank: the config keys, DeepSpeed's CSV layout parsed back
// value by value against the engine's own StepReports, the TensorBoard event file read back by an
// independent decoder (bitwise CRC32C, a generic protobuf walk), the memory line and the comms table.
#include <gtest/gtest.h>

#include <algorithm>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/world.h"
#include "core/errors.h"
#include "core/json.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "engine/detail/event_file.h"
#include "engine/monitor.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("zs_monitor_test_{}_{}", name, getpid());
  fs::remove_all(d);
  return d;
}

std::string config_text(const fs::path& dir, const std::string& extra) {
  return fmt::format(R"({{"train_batch_size": 4, "train_steps": 3, "steps_per_print": 2, "seed": 3,
    "device": {{"memory_mb": 64}}, "model": {{"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 8}},
    "csv_monitor": {{"enabled": true, "output_path": "{0}", "job_name": "job"}},
    "tensorboard": {{"enabled": true, "output_path": "{0}", "job_name": "tb"}},
    "memory_breakdown": true, "comms_logger": {{"enabled": true, "verbose": true}}{1}}})",
                     dir.string(), extra);
}

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// ---- an independent TFRecord / protobuf reader --------------------------------------------------
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

struct Field {
  int number = 0;
  int wire = 0;
  uint64_t varint = 0;  // wire 0
  std::string bytes;    // wire 1 (8 bytes), 2 (payload), 5 (4 bytes)
};
std::vector<Field> fields(const std::string& msg) {
  std::vector<Field> out;
  size_t i = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(msg.at(i++));
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < msg.size()) {
    const uint64_t key = varint();
    Field f{static_cast<int>(key >> 3), static_cast<int>(key & 7)};
    if (f.wire == 0) f.varint = varint();
    else if (f.wire == 1) f.bytes = msg.substr((i += 8) - 8, 8);
    else if (f.wire == 5) f.bytes = msg.substr((i += 4) - 4, 4);
    else if (f.wire == 2) {
      const size_t n = varint();
      f.bytes = msg.substr(i, n);
      i += n;
    } else ADD_FAILURE() << "unexpected wire type " << f.wire;
    out.push_back(f);
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> scalars;
};
std::vector<Event> read_events(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Event> events;
  size_t at = 0;
  while (at < all.size()) {
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, all.data() + at, 8);
    std::memcpy(&len_crc, all.data() + at + 8, 4);
    EXPECT_EQ(len_crc, masked(crc32c_bitwise(reinterpret_cast<const unsigned char*>(all.data() + at), 8)));
    const std::string data = all.substr(at + 12, len);
    std::memcpy(&data_crc, all.data() + at + 12 + len, 4);
    EXPECT_EQ(data_crc, masked(crc32c_bitwise(reinterpret_cast<const unsigned char*>(data.data()), data.size())));
    at += 16 + len;
    Event e;
    for (const Field& f : fields(data)) {
      if (f.number == 1 && f.wire == 1) std::memcpy(&e.wall_time, f.bytes.data(), 8);
      if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.varint);
      if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
      if (f.number == 5 && f.wire == 2) {
        for (const Field& v : fields(f.bytes)) {
          EXPECT_EQ(v.number, 1);
          std::string tag;
          float value = 0;
          for (const Field& x : fields(v.bytes)) {
            if (x.number == 1) tag = x.bytes;
            if (x.number == 2 && x.wire == 5) std::memcpy(&value, x.bytes.data(), 4);
          }
          e.scalars[tag] = value;
        }
      }
    }
    events.push_back(e);
  }
  EXPECT_EQ(at, all.size());
  return events;
}

// ---- tests --------------------------------------------------------------------------------------
TEST(MonitorConfig, ReadsTheSectionsAndDeepSpeedsOpNames) {
  zs::run::RunConfig c = zs::run::parse_run_config(parse_json_text(R"({"train_batch_size": 4, "memory_breakdown": true,
      "csv_monitor": {"enabled": true, "output_path": "out/", "job_name": "j"}, "tensorboard": {"enabled": false},
      "comms_logger": {"enabled": true, "verbose": true, "prof_all": false,
                       "prof_ops": ["all_reduce", "all_gather_into_tensor"], "debug": true}})"),
                                1);
  EXPECT_TRUE(c.monitor.memory_breakdown);
  EXPECT_TRUE(c.monitor.csv.enabled);
  EXPECT_EQ(c.monitor.csv.output_path, "out/");
  EXPECT_EQ(c.monitor.csv.job_name, "j");
  EXPECT_FALSE(c.monitor.tensorboard.enabled);
  EXPECT_EQ(c.monitor.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_FALSE(c.monitor.comms.prof_all);
  EXPECT_EQ(c.monitor.comms.prof_ops, (std::vector<std::string>{"allreduce", "allgather", "allgatherv"}));
  // The debug note, and the one that names the default optimizer (no `optimizer` section here).
  ASSERT_EQ(c.notes.size(), 2u);
  EXPECT_EQ(std::count_if(c.notes.begin(), c.notes.end(),
                          [](const std::string& n) { return n.find("comms_logger.debug: accepted; has no effect") != std::string::npos; }),
            1);
}

TEST(MonitorConfig, RefusesBadValuesByPath) {
  auto error = [](const std::string& text) {
    try {
      zs::run::parse_run_config(parse_json_text(text), 1);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"train_batch_size": 4, "comms_logger": {"prof_ops": ["all_reduse"]}})")
                .find("comms_logger.prof_ops[0]: 'all_reduse' is not a collective zeroshard runs (did you mean "
                      "'all_reduce'?)"),
            std::string::npos);
  EXPECT_NE(error(R"({"train_batch_size": 4, "csv_monitor": {"job_name": "a/b"}})").find("csv_monitor.job_name: 'a/b'"),
            std::string::npos);
  EXPECT_NE(error(R"({"train_batch_size": 4, "csv_monitor": {"enabeld": true}})")
                .find("csv_monitor.enabeld: unknown key; did you mean 'enabled'"),
            std::string::npos);
  EXPECT_NE(error(R"({"train_batch_size": 4, "wandb": {"enabled": true}})").find("wandb.enabled"), std::string::npos);
}

TEST(Monitor, UnwritablePathNamesThePathAndTheKey) {
  zs::run::RunConfig c;
  c.monitor.csv = {.enabled = true, .output_path = "/proc/zeroshard_no_such_dir", .job_name = "j"};
  try {
    TrainingMonitor m(c, 0);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("csv_monitor.output_path: cannot create the directory "
                                         "'/proc/zeroshard_no_such_dir/j'"),
              std::string::npos)
        << e.what();
  }
  TrainingMonitor other_rank(c, 1);  // ranks other than 0 write nothing, so touch nothing
  EXPECT_EQ(other_rank.csv_dir(), "");
}

TEST(Monitor, CsvAndTensorBoardHoldEveryStepsValues) {
  const fs::path dir = fresh_dir("files");
  comm::World world = comm::World::create();
  zs::run::RunConfig cfg = zs::run::parse_run_config(parse_json_text(config_text(dir, "")), 1);
  std::vector<StepReport> reports;
  {
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, world.group());
    DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 5);
    for (int i = 0; i < cfg.train_steps; ++i) reports.push_back(engine.train_batch(source));
  }
  // DeepSpeed's layout: output_path/job_name/<event with '/' as '_'>.csv, "step,<last part>", and the
  // step column counts samples.
  const fs::path csv = dir / "job";
  for (const auto& [file, pick] : std::vector<std::pair<std::string, double StepReport::*>>{
           {"Train_Samples_train_loss", &StepReport::loss}, {"Train_Samples_lr", &StepReport::lr}}) {
    std::vector<std::string> lines = read_lines(csv / (file + ".csv"));
    ASSERT_EQ(lines.size(), 4u) << file;
    EXPECT_EQ(lines[0], "step," + file.substr(std::strlen("Train_Samples_")));  // "step,train_loss"
    for (size_t k = 0; k < 3; ++k) {
      std::istringstream row(lines[k + 1]);
      int64_t step = 0;
      char comma = 0;
      double value = 0;
      row >> step >> comma >> value;
      EXPECT_EQ(step, static_cast<int64_t>(k + 1) * 4);
      EXPECT_EQ(value, reports[k].*pick) << file << " row " << k;  // shortest round-trip form: exact
    }
  }
  for (const char* extra : {"Train_Samples_tokens_per_second", "Train_Samples_samples_per_second",
                            "Train_Samples_device_memory_bytes", "Train_Samples_device_memory_peak_bytes"}) {
    std::vector<std::string> lines = read_lines(csv / (std::string(extra) + ".csv"));
    ASSERT_EQ(lines.size(), 4u) << extra;
    EXPECT_GT(std::stod(lines[3].substr(lines[3].find(',') + 1)), 0.0) << extra;
  }
  EXPECT_FALSE(fs::exists(csv / "Train_Samples_loss_scale.csv"));  // fp32: no loss scale

  std::vector<fs::path> tb;
  for (const auto& e : fs::directory_iterator(dir / "tb")) tb.push_back(e.path());
  ASSERT_EQ(tb.size(), 1u);
  EXPECT_EQ(tb[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::vector<Event> events = read_events(tb[0]);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  for (size_t k = 0; k < 3; ++k) {
    const Event& e = events[k + 1];
    EXPECT_EQ(e.step, static_cast<int64_t>(k + 1) * 4);
    EXPECT_GT(e.wall_time, 1.6e9);
    EXPECT_EQ(e.scalars.at("Train/Samples/train_loss"), static_cast<float>(reports[k].loss));
    EXPECT_EQ(e.scalars.at("Train/Samples/lr"), static_cast<float>(reports[k].lr));
    EXPECT_EQ(e.scalars.size(), 6u);
  }
  fs::remove_all(dir);
}

TEST(Monitor, Crc32cMatchesTheCheckValue) {
  // The CRC-32C check value (RFC 3720, appendix B.4: "123456789"), for both implementations.
  EXPECT_EQ(detail::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_bitwise(reinterpret_cast<const unsigned char*>("123456789"), 9), 0xE3069283u);
}

TEST(Monitor, MemoryLineAndCommsTable) {
  memory::MemorySnapshot s;
  auto set = [&](memory::Category c, size_t cur, size_t peak) {
    s.current[static_cast<size_t>(c)][0] = cur;
    s.peak[static_cast<size_t>(c)][0] = peak;
  };
  set(memory::Category::kParams, 1 << 20, 1 << 20);
  set(memory::Category::kActivations, 0, 3 << 19);
  s.tier_current[0] = 1 << 20;
  s.tier_peak[0] = 5 << 19;
  EXPECT_EQ(memory_breakdown_line(s),
            "memory (MiB, current (peak)): device 1.0 MiB (peak 2.5) = params 1.0 (1.0) | grads 0.0 (0.0) | optimizer "
            "0.0 (0.0) | activations 0.0 (1.5) | comm_buffers 0.0 (0.0) | offload_buffers 0.0 (0.0)");
  s.tier_peak[1] = 4096;  // host bytes appear once there are any
  EXPECT_NE(memory_breakdown_line(s).find("; host 0.0 MiB (peak 0.0) ="), std::string::npos);

  std::vector<comm::OpStats> ops = {{"allreduce", 4, 1'000'000'000, 2.0}, {"barrier", 1, 0, 0.001}};
  const std::string all = comms_table(ops, {});
  EXPECT_NE(all.find("Comm. Op"), std::string::npos);
  // 1e9 bytes in 2 s: 4 Gbps; 2000 ms over 4 calls: 500 ms each.
  EXPECT_NE(all.find("allreduce                4      1000000000            2000.000           500.000             "
                     "4.000"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("barrier"), std::string::npos);
  // One host: DeepSpeed's columns only. Bytes across hosts (docs/multihost.md) add their column.
  EXPECT_EQ(all.find("Inter-host bytes"), std::string::npos) << all;
  ops[0].bytes_inter_host = 600'000'000;
  const std::string hosts = comms_table(ops, {});
  EXPECT_NE(hosts.find("busbw (Gbps)    Inter-host bytes"), std::string::npos) << hosts;
  EXPECT_NE(hosts.find("4.000           600000000"), std::string::npos) << hosts;
  CommsLoggerConfig only_barrier{.enabled = true, .prof_all = false, .prof_ops = {"barrier"}};
  EXPECT_EQ(comms_table(ops, only_barrier).find("allreduce"), std::string::npos);
}

// The end-of-run table covers the whole run; what came after the last step (the summary's digest
// gathers) is its own table, the difference of the tallies.
TEST(Monitor, CollectivesAfterTheLastStepAreTheTalliesDifference) {
  const std::vector<comm::OpStats> at_step = {{"allgatherv", 312, 7'626'336, 1.5, 5'084'256, 10'000'000, 9'000'000},
                                              {"allreduce", 26, 308, 0.07}};
  std::vector<comm::OpStats> end = at_step;
  end[0].count += 52;
  end[0].bytes_sent += 2'502'912;
  end[0].seconds += 0.5;
  end[0].bytes_inter_host += 1'668'608;
  end.push_back({"broadcast", 1, 8, 0.001});
  const auto after = comm::ops_since(end, at_step);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].name, "allgatherv");
  EXPECT_EQ(after[0].count, 52u);
  EXPECT_EQ(after[0].bytes_sent, 2'502'912u);
  EXPECT_EQ(after[0].bytes_inter_host, 1'668'608u);
  EXPECT_NEAR(after[0].seconds, 0.5, 1e-9);
  EXPECT_EQ(after[1].name, "broadcast");  // new since the step: whole
  EXPECT_EQ(after[1].count, 1u);
  EXPECT_TRUE(comm::ops_since(at_step, at_step).empty());
}

TEST(Monitor, CollectivesAreTallied) {
  comm::World world = comm::World::create();
  const auto before = world.group().op_stats();
  float x[3] = {1, 2, 3};
  world.group().allreduce(memory::Tensor(x, memory::DType::kF32, {3}));
  world.group().allreduce(memory::Tensor(x, memory::DType::kF32, {3}));
  uint64_t count = 0;
  for (const auto& op : world.group().op_stats()) {
    if (op.name == "allreduce") count += op.count;
  }
  for (const auto& op : before) {
    if (op.name == "allreduce") count -= op.count;
  }
  EXPECT_EQ(count, 2u);
}

// comms_logger.trace_file: each rank's collectives as a Chrome trace, read back as JSON (the collectives
// of a run on several ranks: e2e_train_monitor.np2; the records themselves: comm_groups_test).
TEST(Monitor, TraceFileIsAChromeTraceOfTheCollectives) {
  EXPECT_EQ(trace_file_of("/tmp/t.json", 3), "/tmp/t.rank3.json");
  EXPECT_EQ(trace_file_of("/tmp/t-{rank}.trace", 12), "/tmp/t-12.trace");
  EXPECT_EQ(trace_file_of("trace", 0), "trace.rank0");
  const std::vector<comm::TraceEvent> events = {
      {.name = "allgatherv", .group = "dp", .start_s = 12.5, .seconds = 0.000638, .bytes_sent = 1251456, .bytes_inter_host = 834304},
      {.name = "reduce_scatter", .group = "dp", .start_s = 12.6, .seconds = 0.0108, .bytes_sent = 625728, .on_worker = true}};
  const boost::json::value doc = parse_json_text(chrome_trace(events, 3));
  const boost::json::array& all = doc.at("traceEvents").as_array();
  ASSERT_EQ(all.size(), 5u);  // the process's and its two threads' names, then the collectives
  EXPECT_EQ(all[0].at("args").at("name").as_string(), "rank 3");
  EXPECT_EQ(all[2].at("args").at("name").as_string(), "comm worker");
  for (size_t i = 0; i < 2; ++i) {
    const boost::json::object& e = all[3 + i].as_object();
    EXPECT_EQ(e.at("ph").as_string(), "X");
    EXPECT_EQ(e.at("pid").as_int64(), 3);
    EXPECT_EQ(e.at("name").as_string(), events[i].name);
    EXPECT_EQ(e.at("tid").as_int64(), events[i].on_worker ? 1 : 0);
    EXPECT_NEAR(e.at("ts").to_number<double>(), events[i].start_s * 1e6, 1e-3);  // microseconds
    EXPECT_NEAR(e.at("dur").to_number<double>(), events[i].seconds * 1e6, 1e-3);
    EXPECT_EQ(e.at("args").at("group").as_string(), "dp");
    EXPECT_EQ(e.at("args").at("bytes_sent").to_number<uint64_t>(), events[i].bytes_sent);
    EXPECT_EQ(e.at("args").at("bytes_inter_host").to_number<uint64_t>(), events[i].bytes_inter_host);
  }
  // An engine's run writes its rank's file when it ends (one rank: whatever few collectives it ran).
  const fs::path dir = fresh_dir("trace");
  fs::create_directories(dir);
  comm::World world = comm::World::create();
  zs::run::RunConfig cfg = zs::run::parse_run_config(
      parse_json_text(fmt::format(R"({{"train_batch_size": 4, "train_steps": 2, "seed": 3, "device": {{"memory_mb": 64}},
        "model": {{"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 8}},
        "comms_logger": {{"enabled": true, "trace_file": "{}"}}}})",
                                  (dir / "trace.json").string())),
      1);
  {
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, world.group());
    DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 5);
    for (int i = 0; i < cfg.train_steps; ++i) engine.train_batch(source);
  }
  std::ifstream in(dir / "trace.rank0.json");
  ASSERT_TRUE(in) << "no trace file";
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GE(parse_json_text(text).at("traceEvents").as_array().size(), 3u);
  fs::remove_all(dir);
}

TEST(Monitor, TraceFileNeedsTheLoggerAndAWritablePath) {
  std::vector<std::string> notes = zs::run::parse_run_config(
      parse_json_text(R"({"train_batch_size": 4, "comms_logger": {"trace_file": "t.json"}})"), 1).notes;
  EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("comms_logger.trace_file: no trace is written while comms_logger.enabled is false") != std::string::npos;
  }));
  zs::run::RunConfig c;
  c.monitor.comms.enabled = true;
  c.monitor.comms.trace_file = "/proc/zeroshard_no_such_dir/t.json";
  try {
    TrainingMonitor m(c, 2);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("comms_logger.trace_file: rank 2 cannot write '/proc/zeroshard_no_such_dir/t.rank2.json'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zs::engine
