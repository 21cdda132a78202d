// The scaling projection (project/project.h): the --network parser, simulated groups that know their
// hosts (the counting the projection relies on), and a projection's bytes by host layout, expert
// parallelism and ZeRO++ included.
#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "comm/group.h"
#include "comm/topology.h"
#include "core/errors.h"
#include "memory/tensor.h"
#include "project/detail/project_detail.h"
#include "project/project.h"

namespace zs::project {
namespace {

TEST(ParseNetwork, UnitsOfBitsAndBytes) {
  const Network a = parse_network("10gbit,20us");
  EXPECT_DOUBLE_EQ(a.bytes_per_s, 1.25e9);
  EXPECT_DOUBLE_EQ(a.latency_s, 20e-6);
  EXPECT_EQ(a.text, "10gbit,20us");
  const Network b = parse_network("1.25GBps,1ms");
  EXPECT_DOUBLE_EQ(b.bytes_per_s, 1.25e9);
  EXPECT_DOUBLE_EQ(b.latency_s, 1e-3);
  EXPECT_DOUBLE_EQ(parse_network("100mbit,0s").bytes_per_s, 12.5e6);
  EXPECT_DOUBLE_EQ(parse_network("800kbit,5ns").latency_s, 5e-9);
}

TEST(ParseNetwork, BadValuesNameTheFlagAndTheFix) {
  auto message = [](const std::string& text) {
    try {
      parse_network(text);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("10gbit").find("--network: '10gbit' has no comma; give BANDWIDTH,LATENCY such as 10gbit,20us"),
            std::string::npos);
  EXPECT_NE(message("10gbits,20us").find("--network: bandwidth '10gbits' is not a number with a unit"), std::string::npos);
  EXPECT_NE(message("fast,20us").find("bandwidth 'fast'"), std::string::npos);
  EXPECT_NE(message("0gbit,20us").find("bandwidth '0gbit' must be positive"), std::string::npos);
  EXPECT_NE(message("10gbit,20").find("latency '20' is not a number with a unit"), std::string::npos);
  EXPECT_NE(message("10gbit,-1us").find("latency '-1us' must not be negative"), std::string::npos);
  EXPECT_NE(message("10gbit,20us,lots").find("burst 'lots' is not a number with a unit"), std::string::npos);
  EXPECT_NE(message("10gbit,20us,-1kb").find("burst '-1kb' must not be negative"), std::string::npos);
  EXPECT_NE(message("10gbit,20us,1mb,2").find("'10gbit,20us,1mb,2' has more than three fields"), std::string::npos);
}

// The optional third field: a shaper's bucket (Note [the link's bucket] in project/project_compute.cpp).
TEST(ParseNetwork, BurstInBytes) {
  EXPECT_DOUBLE_EQ(parse_network("10gbit,20us").burst_bytes, 0.0);  // a NIC at its line rate
  EXPECT_DOUBLE_EQ(parse_network("1gbit,20us,1250000b").burst_bytes, 1.25e6);
  EXPECT_DOUBLE_EQ(parse_network("1gbit,20us,64KiB").burst_bytes, 65536.0);
  EXPECT_DOUBLE_EQ(parse_network("1gbit,20us,1.5mb").burst_bytes, 1.5e6);
  EXPECT_DOUBLE_EQ(parse_network("1gbit,20us,2mib").burst_bytes, 2.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_network("100mbit,50us,125kb").bytes_per_s, 12.5e6);
}

// Group::simulated with hosts counts bytes across hosts by the real groups' rule (Note [Bytes across
// hosts] in comm/config.h), which the projection's measurement relies on.
TEST(SimulatedHosts, CountsBytesAcrossHostsAsARealGroup) {
  std::vector<float> data(1000);
  const memory::Tensor t = memory::Tensor::of(data);
  const comm::Group g = comm::Group::simulated(0, 4, "dp", {0, 0, 1, 1});
  EXPECT_EQ(g.hosts(), 2);
  EXPECT_EQ(g.host_ranks(), 2);
  g.allreduce(t);
  EXPECT_EQ(g.bytes_sent(), 2u * 3 * 1000 / 4 * 4);
  EXPECT_EQ(g.bytes_inter_host(), 2u * 2 * 1000 / 4 * 4);
  const comm::Group one = comm::Group::simulated(1, 2, "dp", {5, 5});  // one host: none across
  one.allreduce(t);
  EXPECT_EQ(one.bytes_inter_host(), 0u);
  EXPECT_EQ(one.hosts(), 1);
}

boost::json::value tiny_config(int stage) {
  return boost::json::parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "bf16": {"enabled": true},
    "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "reduce_bucket_size": 3000},
    "model": {"n_layer": 2, "d_model": 32, "n_head": 4, "seq_len": 16}})");
}

Options options(int ranks, int per_host) {
  Options o;
  o.ranks = ranks;
  o.ranks_per_host = per_host;
  o.network = parse_network("1gbit,20us");
  o.machine = {.cores_per_host = 2, .threads_per_rank = 1, .shm_bytes_per_s = 5e9, .shm_latency_s = 5e-6};
  o.only_tp = 1;
  o.only_pp = 1;
  return o;
}

TEST(Project, BytesAcrossHostsFollowTheHostLayout) {
  const Report apart = project(tiny_config(3), options(2, 1));
  const Report together = project(tiny_config(3), options(2, 2));
  ASSERT_EQ(apart.layouts.size(), 1u);
  const Projection& a = apart.layouts.front();
  const Projection& b = together.layouts.front();
  ASSERT_TRUE(a.valid) << a.why_not;
  ASSERT_EQ(a.ranks.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_GT(a.ranks[r].bytes_sent, 0u);
    EXPECT_EQ(a.ranks[r].bytes_inter_host, a.ranks[r].bytes_sent);  // each rank its own host: all cross
    EXPECT_EQ(b.ranks[r].bytes_sent, a.ranks[r].bytes_sent);        // the same collectives
    EXPECT_EQ(b.ranks[r].bytes_inter_host, 0u);
  }
  EXPECT_GT(a.step_s, 0.0);
  EXPECT_GT(a.dp_comm_s, b.dp_comm_s);  // 1 Gbit/s against shared memory
  EXPECT_GT(a.device_peak_bytes, 0u);
  EXPECT_TRUE(a.fits);
}

// A step_comm_probe JSON of 2 hosts of `per_host` ranks: an allgather's cost per call by bytes across,
// in tiny_config's communication dtype (bf16).
boost::json::value probe_json(int per_host, double stretch) {
  return boost::json::parse(R"({"probe": "step_comm_probe", "ranks": )" + std::to_string(2 * per_host) +
                            R"(, "hosts": 2, "ranks_per_host": )" + std::to_string(per_host) +
                            R"(, "work_us": 500, "rounds": 5, "dtype": "bf16", "compute_stretch": )" + std::to_string(stretch) +
                            R"(, "collectives": {"allgather": [{"bytes": 64, "inter_host_bytes": 0, "seconds": 1.0},
                              {"bytes": 1024, "inter_host_bytes": 1000, "seconds": 0.001},
                              {"bytes": 4096, "inter_host_bytes": 3000, "seconds": 0.003}],
                              "reduce_scatter": [{"bytes": 1024, "inter_host_bytes": 1000, "seconds": 0.002}],
                              "alltoall": [{"bytes": 1024, "inter_host_bytes": 500, "seconds": 0.004}]}})");
}

// Note [Busiest member's bytes] in comm/config.h: a collective's time follows the bytes of its busiest
// member (a ZeRO-3 gather of a module one shard holds moves it one way).
TEST(GroupSeconds, ChargesTheBusiestMembersBytes) {
  Options o = options(2, 1);
  o.network = parse_network("8kbit,0s");  // 1000 B/s: the bytes decide
  comm::OpStats uneven{.name = "allgatherv", .count = 2, .bytes_sent = 1000, .bytes_inter_host = 1000,
                       .busiest_bytes = 2000, .busiest_inter_host_bytes = 2000};
  comm::OpStats even = uneven;
  even.busiest_bytes = even.busiest_inter_host_bytes = 1000;
  const double shm = 2 * o.machine.shm_latency_s;
  EXPECT_NEAR(detail::group_seconds({.group = "dp", .ops = {uneven}}, o, 2, 1), 2.0 + shm, 1e-9);
  EXPECT_NEAR(detail::group_seconds({.group = "dp", .ops = {even}}, o, 2, 1), 1.0 + shm, 1e-9);
}

// With the probe, an uneven call costs at most the probe's even call of its busiest member's bytes (those
// bytes both ways), and at least its own bytes' even call and its one-way bytes at the link's rate.
TEST(GroupSeconds, UnevenCallsLieBetweenTheirOwnAndTheirBusiestMembersEvenCall) {
  Options o = options(2, 1);
  o.link_costs = parse_link_costs(boost::json::parse(R"({"probe": "step_comm_probe", "ranks": 2, "hosts": 2,
      "ranks_per_host": 1, "work_us": 500, "rounds": 5, "dtype": "bf16", "compute_stretch": 1.0,
      "collectives": {"allgather": [{"bytes": 2048, "inter_host_bytes": 1000, "seconds": 0.010},
                                    {"bytes": 6144, "inter_host_bytes": 3000, "seconds": 0.030}]}})"),
                                  "probe.json");
  // Two calls, each sending 1000 B across on this rank and 3000 B to its busiest member.
  const comm::OpStats uneven{.name = "allgatherv", .count = 2, .bytes_sent = 2000, .bytes_inter_host = 2000,
                             .busiest_bytes = 6000, .busiest_inter_host_bytes = 6000};
  comm::OpStats even = uneven;
  even.busiest_bytes = even.busiest_inter_host_bytes = 2000;
  auto seconds = [&](const comm::OpStats& op, const std::string& network, int sharers) {
    o.network = parse_network(network);
    return detail::group_seconds({.group = "dp", .ops = {op}}, o, 2, sharers);
  };
  EXPECT_NEAR(seconds(even, "8kbit,0s", 1), 2 * 0.010, 1e-12);         // the probe's, whatever the rate
  EXPECT_NEAR(seconds(uneven, "10gbit,0s", 1), 2 * 0.010, 1e-12);      // a fast link: its own even call
  EXPECT_NEAR(seconds(uneven, "1200kbit,0s", 1), 2 * 0.020, 1e-12);    // 3000 B at 150 KB/s
  EXPECT_NEAR(seconds(uneven, "600kbit,0s", 2), 2 * 0.030, 1e-12);     // 6000 B a host: the busiest's even call
  EXPECT_NEAR(seconds(uneven, "8kbit,0s", 1), 2 * 0.030, 1e-12);
}

// Note [the link's bucket]: the bytes of a step's phases beyond what a shaper's bucket and the pauses
// lend go at the link's rate, in the steady state of a step that repeats.
TEST(BoundByLink, ChargesTheBytesBeyondTheBucketAtTheRate) {
  auto bound = [](std::vector<detail::LinkPhase> phases, const std::string& network, int sharers) {
    detail::bound_by_link(phases, parse_network(network), sharers);
    std::vector<double> s;
    for (const detail::LinkPhase& p : phases) s.push_back(p.seconds);
    return s;
  };
  const detail::LinkPhase one{.busiest_bytes = 1000, .calls = 1, .compute_s = 10.0, .seconds = 0.1};
  // A NIC at its line rate (no bucket): every byte at the rate, the host's ranks sharing it.
  EXPECT_NEAR(bound({one}, "8kbit,0s", 1)[0], 1.0, 1e-12);
  EXPECT_NEAR(bound({one}, "8kbit,0s", 2)[0], 2.0, 1e-12);
  // A bucket that holds the phase's bytes and refills in the pause before it: the calls' own cost.
  EXPECT_NEAR(bound({one}, "8kbit,0s,2000b", 1)[0], 0.1, 1e-12);
  // Two phases in a row, the second with no pause: the first leaves 600 B of the 2000 B bucket (2000 +
  // 0.1 s of refill - 1500), the second sends its other 900 B at the rate, in every step.
  detail::LinkPhase first = one, second = one;
  first.busiest_bytes = second.busiest_bytes = 1500;
  second.compute_s = 0.0;
  const std::vector<double> s = bound({first, second}, "8kbit,0s,2000b", 1);
  EXPECT_NEAR(s[0], 0.1, 1e-12);
  EXPECT_NEAR(s[1], 0.9, 1e-12);
  // Calls spread over compute: each of the 4 pauses (0.5 s) refills at most the 500 B bucket, and the
  // steady state starts from the empty bucket the previous step left: 4000 - 2000 B at the rate.
  const detail::LinkPhase spread{.busiest_bytes = 4000, .calls = 4, .compute_s = 2.0, .interleaved = true, .seconds = 0.1};
  EXPECT_NEAR(bound({spread}, "8kbit,0s,500b", 1)[0], 2.0, 1e-12);
  // The same calls in 2 bursts (ZeRO-3's prefetch: a pass's gathers back to back): 2 pauses of 1 s
  // refill 500 B each, so 3000 B go at the rate.
  detail::LinkPhase bursts = spread;
  bursts.pauses = 2;
  EXPECT_NEAR(bound({bursts}, "8kbit,0s,500b", 1)[0], 3.0, 1e-12);
  // A pause tops the bucket up to its size and no further: after the first phase leaves 600 B, a burst
  // of 2500 B after 2 s (2000 B of refill) finds the full 2000 B bucket and sends 500 B at the rate.
  detail::LinkPhase burst{.busiest_bytes = 2500, .calls = 3, .compute_s = 2.0, .interleaved = true, .pauses = 1, .seconds = 0.1};
  const std::vector<double> topped = bound({first, burst}, "8kbit,0s,2000b", 1);
  EXPECT_NEAR(topped[1], 0.5, 1e-12);
}

// Note [the link's bucket]: ZeRO-3's forward gathers its modules in one burst (the tiny GPT fits the
// prefetch window) before the compute they serve, and the default reuse distance keeps them for the
// backward: the burst finds the bucket as the step's end left it, never more than one bucket, however
// long the passes' compute that follows it. Probe costs of nearly nothing, so the link's bound shows.
TEST(Project, Zero3ForwardGathersFindAtMostOneBucket) {
  Options o = options(2, 1);
  boost::json::value cheap = probe_json(1, 1.0);
  for (auto& [name, rows] : cheap.as_object()["collectives"].as_object()) {
    for (auto& row : rows.as_array()) row.as_object()["seconds"] = 1e-12;
  }
  o.link_costs = parse_link_costs(cheap, "cheap.json");
  boost::json::value config = tiny_config(3);
  config.as_object()["train_batch_size"] = 4;  // one micro-batch a step: one burst
  auto project_with = [&](const std::string& network) {
    o.network = parse_network(network);
    const Projection p = project(config, o).layouts.front();
    EXPECT_TRUE(p.valid) << p.why_not;
    return p;
  };
  const Projection line = project_with("10gbit,0s");  // no bucket: every byte at the rate
  double gathers = 0;
  for (const CollectiveCost& c : line.collectives) {
    if (c.group == "dp" && c.op == "allgatherv") gathers += static_cast<double>(c.busiest_inter_host_bytes);
  }
  ASSERT_GT(gathers, 0.0);
  const double rate = 1.25e9;
  // A bucket of half the burst: the other half at the rate, even after compute that would refill it
  // many times over.
  const Projection half = project_with(fmt::format("10gbit,0s,{:.0f}b", gathers / 2));
  EXPECT_GE(half.dp_exposed_s, (gathers / 2) / rate * (1 - 1e-9));
  EXPECT_LT(half.dp_exposed_s, line.dp_exposed_s);
  // A bucket far above a step's bytes lends them all.
  const Projection deep = project_with("10gbit,0s,1000mb");
  EXPECT_LT(deep.dp_exposed_s, (gathers / 2) / rate);
}

// ZeRO-3 over two hosts of one rank: the flat layout's contiguous shards put most modules in one
// rank's shard, so the step's gathers cross one way each and take longer than the rank's own bytes
// say: the projection's measured groups carry the busiest member's bytes through to the time.
TEST(Project, Zero3GathersTakeTheirOwnersBytesTime) {
  Options o = options(2, 1);
  o.network = parse_network("8mbit,0s");  // 1 MB/s: the bytes decide
  const Projection p = project(tiny_config(3), o).layouts.front();
  ASSERT_TRUE(p.valid) << p.why_not;
  const double own = static_cast<double>(p.ranks[0].bytes_inter_host) / o.network.bytes_per_s;
  EXPECT_GT(p.dp_comm_s, 1.3 * own) << "own bytes' time " << own;
  EXPECT_LT(p.dp_comm_s, 2.2 * own) << "at most the module's bytes each way in turn";
}

TEST(LinkCosts, InterpolatesByBytesAcrossHosts) {
  const LinkCosts lc = parse_link_costs(probe_json(1, 1.5), "probe.json");
  EXPECT_EQ(lc.hosts, 2);
  EXPECT_EQ(lc.ranks_per_host, 1);
  EXPECT_DOUBLE_EQ(lc.compute_stretch, 1.5);
  EXPECT_EQ(lc.dtype, "bf16");
  EXPECT_DOUBLE_EQ(*lc.seconds("allgather", 10), 0.001);     // below the smallest: its cost
  EXPECT_DOUBLE_EQ(*lc.seconds("allgather", 2000), 0.002);   // between: on the line
  EXPECT_DOUBLE_EQ(*lc.seconds("allgatherv", 5000), 0.005);  // beyond: the last slope; allgatherv as allgather
  EXPECT_DOUBLE_EQ(*lc.seconds("reduce_scatter", 7), 0.002);
  EXPECT_FALSE(lc.seconds("allreduce", 100).has_value());    // not measured: the network model
  EXPECT_DOUBLE_EQ(*lc.seconds("alltoallv", 100), 0.004);    // alltoallv (MoE, qgZ) as alltoall
}

// Where a host's ranks share its cores, the probe's wait for host-mates still computing is left out of a
// call's cost: the compute's stretch (ranks / cores) already counts their work (Note [in-step link costs]).
TEST(LinkCosts, LeavesOutTheHostMatesWaitWhereRanksShareCores) {
  boost::json::value doc = probe_json(2, 1.0);
  boost::json::array& gathers = doc.as_object()["collectives"].as_object()["allgather"].as_array();
  gathers[1].as_object()["host_wait_seconds"] = 0.0004;
  gathers[2].as_object()["host_wait_seconds"] = 0.0010;
  const LinkCosts lc = parse_link_costs(doc, "probe.json");
  EXPECT_DOUBLE_EQ(*lc.seconds("allgather", 1000), 0.001);
  EXPECT_DOUBLE_EQ(*lc.seconds("allgather", 1000, true), 0.0006);
  EXPECT_DOUBLE_EQ(*lc.seconds("allgather", 2000, true), 0.002 - 0.0007);  // both lines interpolated
  EXPECT_DOUBLE_EQ(*lc.seconds("reduce_scatter", 1000, true), 0.002);     // no wait measured: none left out
  // Through group_seconds: 2 ranks on a host of 1 core leave it out, on a host of 2 cores they do not.
  Options o = options(4, 2);
  o.link_costs = lc;
  const comm::OpStats gather{.name = "allgatherv", .count = 2, .bytes_sent = 2000, .bytes_inter_host = 2000,
                             .busiest_bytes = 1000, .busiest_inter_host_bytes = 2000};
  const engine::GroupStep g{.group = "dp", .ops = {gather}, .hosts = 2};
  EXPECT_DOUBLE_EQ(detail::group_seconds(g, o, 2, 2), 2 * 0.001);
  o.machine.cores_per_host = 1;
  EXPECT_DOUBLE_EQ(detail::group_seconds(g, o, 2, 2), 2 * 0.0006);
}

// An all-to-all across the probe's hosts (an MoE layer's tokens, ZeRO++'s qgZ) is charged the probe's
// all-to-all per call, each pair's block going straight across: no ring hops, no uneven-call bounds.
TEST(GroupSeconds, ChargesAnAllToAllTheProbesCostPerCall) {
  Options o = options(2, 1);
  o.link_costs = parse_link_costs(probe_json(1, 1.0), "probe.json");
  const comm::OpStats a2a{.name = "alltoallv", .count = 3, .bytes_sent = 1500, .seconds = 0, .bytes_inter_host = 1500,
                          .busiest_bytes = 1500, .busiest_inter_host_bytes = 1500};
  EXPECT_DOUBLE_EQ(detail::group_seconds(engine::GroupStep{.group = "ep", .ops = {a2a}, .hosts = 2}, o, 2, 1), 3 * 0.004);
  // Without the probe: one latency a call and the bytes over the link.
  o.link_costs = {};
  o.network = parse_network("8kbit,1ms");  // 1000 B/s
  EXPECT_NEAR(detail::group_seconds(engine::GroupStep{.group = "ep", .ops = {a2a}, .hosts = 2}, o, 2, 1),
              3 * (o.machine.shm_latency_s + 1e-3) + 1.5, 1e-9);
}

TEST(LinkCosts, BadFilesNameTheKeyAndTheFix) {
  auto message = [](const std::string& text) {
    try {
      parse_link_costs(boost::json::parse(text), "p.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[]").find("--link-costs: 'p.json': not a JSON object; give the JSON of benchmarks/step_comm_probe"),
            std::string::npos);
  EXPECT_NE(message(R"({"ranks": 2, "hosts": 2, "ranks_per_host": 1})").find("compute_stretch is missing"),
            std::string::npos);
  EXPECT_NE(message(R"({"ranks": 2, "hosts": 1, "ranks_per_host": 2, "compute_stretch": 1, "collectives": {}})")
                .find("the probe ran on one host"),
            std::string::npos);
  EXPECT_NE(message(R"({"ranks": 2, "hosts": 2, "ranks_per_host": 1, "compute_stretch": 1,
                        "collectives": {"allgather": [{"bytes": 4, "seconds": 1}]}})")
                .find("collectives.allgather[0].inter_host_bytes is missing"),
            std::string::npos);
}

TEST(Project, ChargesTheProbesInStepCostsAcrossHosts) {
  Options o = options(2, 1);
  const Report model = project(tiny_config(3), o);
  o.link_costs = parse_link_costs(probe_json(1, 3.0), "probe.json");
  const Report probed = project(tiny_config(3), o);
  const Projection& a = model.layouts.front();
  const Projection& b = probed.layouts.front();
  ASSERT_TRUE(b.valid) << b.why_not;
  // The compute's factor: the probe's stretch instead of ranks / cores (each project() measures its
  // compute anew, so their seconds are not compared).
  EXPECT_EQ(model.oversubscription, 1.0);
  EXPECT_EQ(probed.oversubscription, 3.0);
  EXPECT_GT(b.dp_comm_s, a.dp_comm_s);  // 1-3 ms per gather against 1 Gbit/s's microseconds
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(b.ranks[r].bytes_sent, a.ranks[r].bytes_sent);  // bytes untouched
  // Costs far below the link's rate: the bytes at --network's bandwidth bound the step.
  boost::json::value cheap = probe_json(1, 1.0);
  for (auto& [name, rows] : cheap.as_object()["collectives"].as_object()) {
    for (auto& row : rows.as_array()) row.as_object()["seconds"] = 1e-12;
  }
  o.link_costs = parse_link_costs(cheap, "cheap.json");
  const Projection c = project(tiny_config(3), o).layouts.front();
  EXPECT_GE(c.dp_comm_s, static_cast<double>(c.ranks[0].bytes_inter_host) / o.network.bytes_per_s);
  // Hosts of 2 ranks on 1 core: a probe's stretch below ranks / cores (its ranks yield while waiting)
  // does not lower the compute's factor below 2.
  Options shared = options(4, 2);
  shared.machine.cores_per_host = 1;
  shared.link_costs = parse_link_costs(probe_json(2, 1.2), "probe.json");
  EXPECT_EQ(project(tiny_config(3), shared).oversubscription, 2.0);
  shared.link_costs = parse_link_costs(probe_json(2, 3.5), "probe.json");
  EXPECT_EQ(project(tiny_config(3), shared).oversubscription, 3.5);
  o.link_costs = parse_link_costs(probe_json(2, 1.0), "probe.json");
  try {
    project(tiny_config(3), o);
    ADD_FAILURE() << "a probe of another host layout was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--link-costs: 'probe.json' was measured with 2 ranks per host, the projection has 1"),
              std::string::npos);
  }
  // A probe of another dtype took another path (MPI's own fp32 reduce-scatter, not comm's 16-bit one):
  // refused, as is a file from before the key (fp32).
  for (const char* dtype : {"fp32", ""}) {
    boost::json::value fp32 = probe_json(1, 1.0);
    if (*dtype) {
      fp32.as_object()["dtype"] = dtype;
    } else {
      fp32.as_object().erase("dtype");
    }
    o.link_costs = parse_link_costs(fp32, "fp32.json");
    try {
      project(tiny_config(3), o);
      ADD_FAILURE() << "a probe of another dtype was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--link-costs: 'fp32.json' was measured with fp32 elements, the config "
                                           "communicates in bf16 (communication_data_type, by default the compute "
                                           "dtype); run step_comm_probe --dtype bf16"),
                std::string::npos)
          << e.what();
    }
  }
}

// pp 2 over 2 hosts of 1 rank: a send is the probe's sendrecv cost, a delay before the receiving
// stage's pass (Note [transfer delay] in pp/schedule.h); on the link a send queues behind the one before
// it, and a shaper's bucket sends at once what its tokens cover (Note [a pipeline's sends through the
// link] in project/project.cpp).
TEST(Project, PipelineSendsAreTheProbesCostBoundedByTheLinkRate) {
  Options o = options(2, 1);
  o.only_pp = 2;
  auto with_sendrecv = [](double secs) {
    boost::json::value v = probe_json(1, 1.0);
    v.as_object()["collectives"].as_object()["sendrecv"] =
        boost::json::parse(R"([{"bytes": 64, "inter_host_bytes": 64, "seconds": )" + std::to_string(secs) + "}]");
    return parse_link_costs(v, "probe.json");
  };
  o.link_costs = with_sendrecv(0.05);
  const Projection slow = project(tiny_config(1), o).layouts.front();
  ASSERT_TRUE(slow.valid) << slow.why_not;
  EXPECT_DOUBLE_EQ(slow.pp_transfer_s, 0.05);
  // 4 micro-batches at 2 in flight: a micro-batch's forward there and backward back, twice in a row.
  EXPECT_GT(slow.pipeline_s, 4 * 0.05);
  EXPECT_LT(slow.pipeline_s, 8 * 0.05 + 0.5);
  // A cheap probe at 1 Mbit/s: the sends' bytes at the link's rate are the pipeline's floor.
  o.network = parse_network("1mbit,20us");
  o.link_costs = with_sendrecv(1e-9);
  const Projection cheap = project(tiny_config(1), o).layouts.front();
  // Stage 0's 4 activations of micro-batch 2 x seq 16 x d_model 32 in f32 (its pp bytes also hold the tied
  // embedding's gradient all-reduce, which stays on the passes).
  const double sends = 4.0 * 2 * 16 * 32 * 4 / o.network.bytes_per_s;
  EXPECT_GT(sends, 0.1);
  // Stage 0's 4 sends one after another on its link (the passes take about a millisecond), then the last
  // micro-batch's gradient back on stage 1's: 5 sends' time.
  EXPECT_GE(cheap.pipeline_s, 1.25 * sends);
  EXPECT_LT(cheap.pipeline_s, 1.4 * sends);
  // Each send at least at the rate where nothing refills a bucket (a NIC at its line rate: --network's
  // BURST 0), more where it waited for the one before it ...
  EXPECT_GT(cheap.pp_transfer_s, sends / 4);
  // ... and less where a shaper's bucket sends at once what the pauses refilled: a 64 KiB bucket holds all
  // 8 sends of 4 KiB, each then costs the probe's call (about nothing); the link's sustained rate still
  // bounds the step (the bucket lends a step's bytes only once).
  o.network = parse_network("1mbit,20us,64kib");
  const Projection bucket = project(tiny_config(1), o).layouts.front();
  EXPECT_LT(bucket.pp_transfer_s, 1e-6);
  EXPECT_NEAR(bucket.pipeline_s, sends, 1e-9);
  // The probe's in-step cost of a send is its least, bucket or not.
  o.link_costs = with_sendrecv(0.05);
  EXPECT_DOUBLE_EQ(project(tiny_config(1), o).layouts.front().pp_transfer_s, 0.05);
  o.link_costs = with_sendrecv(1e-9);
  // A bucket smaller than a send: the send's bytes beyond it go at the rate; with 1 KiB the first send's
  // 3 KiB beyond the bucket, the later ones' beyond what the pauses refilled.
  o.network = parse_network("1mbit,20us,1kib");
  const Projection small = project(tiny_config(1), o).layouts.front();
  EXPECT_GT(small.pp_transfer_s, 3.0 / 4.0 * sends / 4);
  EXPECT_LT(small.pp_transfer_s, cheap.pp_transfer_s);
}

TEST(Project, RefusesLayoutsWithAReason) {
  Options o = options(2, 1);
  o.only_tp = 2;
  const Report rep = project(tiny_config(1), o);
  ASSERT_EQ(rep.layouts.size(), 1u);
  EXPECT_FALSE(rep.layouts.front().valid);
  EXPECT_NE(rep.layouts.front().why_not.find("tp 2 does not divide the 1 ranks of a host"), std::string::npos);
  EXPECT_THROW(project(tiny_config(1), options(4, 3)), ConfigError);
  Options no_net = options(4, 2);
  no_net.network = {};
  EXPECT_THROW(project(tiny_config(1), no_net), ConfigError);
}

// The groups the engine and the models split off a simulated one keep their members' hosts
// (Group::simulated_subgroup), so their bytes across hosts count as a real split's.
TEST(SimulatedHosts, SubgroupsKeepTheirMembersHosts) {
  const comm::Group dp = comm::Group::simulated(2, 4, "dp", {0, 0, 1, 1});
  const comm::Topology::HostGroups h = comm::Topology::make_host_groups(dp, 2);
  EXPECT_EQ(h.host.rank(), 0);
  EXPECT_EQ(h.host.size(), 2);
  EXPECT_EQ(h.host.hosts(), 1);  // dp ranks 2 and 3: one host
  EXPECT_TRUE(h.host.member_hosts().empty());
  EXPECT_EQ(h.across.rank(), 1);
  EXPECT_EQ(h.across.hosts(), 2);  // dp ranks 0 and 2
  EXPECT_EQ(h.across.member_hosts(), (std::vector<int>{0, 1}));
  const int edp_members[] = {0, 2};
  const comm::Group edp = dp.simulated_subgroup(edp_members, "edp");
  EXPECT_EQ(edp.rank(), 1);
  EXPECT_EQ(edp.name(), "edp");
  std::vector<float> data(1000);
  edp.allreduce(memory::Tensor::of(data));
  EXPECT_EQ(edp.bytes_inter_host(), edp.bytes_sent());
  EXPECT_GT(edp.bytes_sent(), 0u);
}

// A GPT-MoE of 4 experts (top-2), one MoE block of 2, as tiny_config.
boost::json::value moe_config(int stage) {
  boost::json::value c = tiny_config(stage);
  c.as_object()["model"].as_object()["moe"] =
      boost::json::parse(R"({"num_experts": 4, "k": 2, "capacity_factor": 1.0, "every_n_layers": 2})");
  return c;
}

// Note [expert-parallel layouts] in project.cpp: every expert-parallel degree that divides dp and the
// experts; the all-to-alls' bytes counted on the "ep" group with their hosts, the experts' ZeRO
// collectives on the "edp" groups.
TEST(Project, ExpertParallelLayoutsCountTheAllToAllsAndTheExpertGroups) {
  Options o = options(4, 1);  // four hosts of one rank: every byte crosses
  o.only_ep = 0;
  const Report apart = project(moe_config(1), o);
  std::vector<int> eps;
  for (const Projection& p : apart.layouts) {
    ASSERT_TRUE(p.valid) << p.why_not;
    eps.push_back(p.layout.ep);
    ASSERT_EQ(p.ranks.size(), 4u);
    for (const RankBytes& b : p.ranks) {
      EXPECT_EQ(b.bytes_inter_host, b.bytes_sent) << "ep " << p.layout.ep << " rank " << b.rank;
      EXPECT_EQ(b.ep_bytes > 0, p.layout.ep > 1) << "ep " << p.layout.ep;
    }
    EXPECT_EQ(p.ep_comm_s > 0, p.layout.ep > 1);
  }
  std::sort(eps.begin(), eps.end());
  EXPECT_EQ(eps, (std::vector<int>{1, 2, 4}));
  EXPECT_NE(apart.model.find("MoE 4 experts top-2"), std::string::npos) << apart.model;
  // Hosts of 2 at ep 2: each expert-parallel group inside a host, its all-to-alls cross nothing.
  Options together = options(4, 2);
  together.only_ep = 2;
  const Report two = project(moe_config(1), together);
  ASSERT_EQ(two.layouts.size(), 1u);
  ASSERT_TRUE(two.layouts.front().valid) << two.layouts.front().why_not;
  for (const RankBytes& b : two.layouts.front().ranks) {
    EXPECT_GT(b.ep_bytes, 0u);
    EXPECT_LE(b.bytes_inter_host, b.bytes_sent - b.ep_bytes);
  }
  // A dense model has no expert-parallel degree to try.
  Options dense = options(2, 1);
  dense.only_ep = 2;
  EXPECT_THROW(project(tiny_config(1), dense), ConfigError);
}

// Note [reductions behind the backward's calls]: the gradients' reductions across hosts hide under the
// backward pass only while its own calls leave the link free.
TEST(Project, ReductionsHideOnlyWhereTheBackwardLeavesTheLinkFree) {
  auto hidden = [](int ep, const char* network) {
    Options o = options(2, 1);  // two hosts of one rank: the reductions and the all-to-alls cross
    o.only_ep = ep;
    o.network = parse_network(network);
    const Projection p = project(moe_config(1), o).layouts.front();
    EXPECT_TRUE(p.valid) << p.why_not;
    EXPECT_GT(p.dp_comm_s, 0.0);
    return p.dp_comm_s - p.dp_exposed_s;
  };
  // At 1 Mbit/s ep 2's all-to-alls hold the link through the backward pass: nothing is hidden.
  EXPECT_NEAR(hidden(2, "1mbit,20us"), 0.0, 1e-12);
  // At ep 1 no all-to-all crosses; on a fast link ep 2's take a sliver of the pass: a pass's worth is hidden.
  EXPECT_GT(hidden(1, "1mbit,20us"), 0.0);
  EXPECT_GT(hidden(2, "100gbit,1us"), 0.0);
}

TEST(Project, ExpertParallelGroupsStraddlingHostsUnevenlyAreRefused) {
  Options o = options(6, 2);  // ep 3 over hosts of 2: groups {0,1,2} and {3,4,5} cross unlike each other
  o.only_ep = 3;
  boost::json::value c = moe_config(1);
  c.as_object()["model"].as_object()["moe"].as_object()["num_experts"] = 6;
  c.as_object()["train_batch_size"] = 12;
  const Report rep = project(c, o);
  ASSERT_EQ(rep.layouts.size(), 1u);
  EXPECT_FALSE(rep.layouts.front().valid);
  EXPECT_NE(rep.layouts.front().why_not.find("an expert-parallel group's 3 ranks (ep 3 x tp 1) and the host's 2"),
            std::string::npos)
      << rep.layouts.front().why_not;
}

// ZeRO++ (hpZ, qwZ, qgZ) on two hosts of 2: its host groups counted with their hosts, so the bytes
// across hosts fall against plain ZeRO-3's; with experts the engine's refusal is the layout's reason.
TEST(Project, ZeroPlusPlusCutsTheBytesAcrossHosts) {
  const Options o = options(4, 2);
  boost::json::value base = tiny_config(3);
  base.as_object()["zero_optimization"].as_object()["stage3_param_persistence_threshold"] = 0;  // every module gathered
  boost::json::value zpp = base;
  boost::json::object& z = zpp.as_object()["zero_optimization"].as_object();
  z["zero_hpz_partition_size"] = 2;
  z["zero_quantized_weights"] = true;
  z["zero_quantized_gradients"] = true;
  const Projection plain = project(base, o).layouts.front();
  const Projection plus = project(zpp, o).layouts.front();
  ASSERT_TRUE(plain.valid) << plain.why_not;
  ASSERT_TRUE(plus.valid) << plus.why_not;
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_GT(plus.ranks[r].bytes_inter_host, 0u);
    EXPECT_LT(2 * plus.ranks[r].bytes_inter_host, plain.ranks[r].bytes_inter_host) << "rank " << r;
  }
  // On four hosts of one rank the host groups span hosts too: every byte of every group crosses.
  const Projection apart = project(zpp, options(4, 1)).layouts.front();
  ASSERT_TRUE(apart.valid) << apart.why_not;
  for (const RankBytes& b : apart.ranks) {
    EXPECT_EQ(b.bytes_sent, plus.ranks[static_cast<size_t>(b.rank)].bytes_sent);
    EXPECT_EQ(b.bytes_inter_host, b.bytes_sent) << "rank " << b.rank;
  }
  boost::json::value moe = moe_config(3);
  moe.as_object()["zero_optimization"] = z;
  Options ep = o;
  ep.only_ep = 2;
  const Projection refused = project(moe, ep).layouts.front();
  EXPECT_FALSE(refused.valid);
  EXPECT_NE(refused.why_not.find("ZeRO++"), std::string::npos) << refused.why_not;
}

}  // namespace
}  // namespace zs::project

TEST(Project, CollectiveProbeMeasuresTheWaitOfRanksSharingCores) {
  using zs::project::probe_collective;
  EXPECT_EQ(probe_collective(1, 2, 0.05).wait_s, 0.0);  // no peers: no collective
  // Two ranks on one core: each waits in the barrier while the other works; what the compute's
  // oversubscription factor (2) already counts is taken off, and what is left is bounded by the probe.
  const zs::project::CollectiveProbe shared = probe_collective(2, 1, 0.05);
  EXPECT_GE(shared.wait_s, 0.0);
  EXPECT_LT(shared.wait_s, 0.05);
  EXPECT_GE(shared.stretch, 1.0);
  // A host of more cores than this machine is probed in the same ratio of ranks to cores.
  EXPECT_GT(probe_collective(64, 64, 0.05).wait_s, 0.0);
}
