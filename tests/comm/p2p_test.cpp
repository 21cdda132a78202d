// Point-to-point transfers (Group::send/recv/sendrecv, Note [Point-to-point] in comm/p2p.cpp): data of
// every dtype around a ring, async overlap, counters, a 1F1B pipeline schedule, and the errors: a
// mismatch and a crossed pair fail at once on both ranks, a stopped peer after comm.timeout_s.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32};

void expect_filled(const Tensor& t, int rank) {
  const Tensor want = test::filled(t.dtype(), static_cast<size_t>(t.numel()), rank);
  ASSERT_EQ(std::memcmp(t.raw(), want.raw(), t.nbytes()), 0) << memory::dtype_name(t.dtype()) << " from rank " << rank;
}

// The pair {0, 1} with a short timeout; other ranks get a group of themselves they do not use.
comm::Group pair(const char* name, double timeout_s) {
  const auto& g = test::world().group();
  comm::Group p = g.split(g.rank() < 2 ? 0 : 1 + g.rank(), g.rank(), name);
  return p.dup(name, comm::CommConfig{.timeout_s = timeout_s});
}

TEST(P2P, RingOfEveryDtype) {
  const auto& g = test::world().group();
  const int n = g.size(), r = g.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (DType t : kDTypes) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{300000}}) {  // 300000: MPI's rendezvous protocol
      Tensor out = test::filled(t, count, r), in = Tensor::empty({static_cast<int64_t>(count)}, t);
      g.sendrecv(out, next, in, prev);
      expect_filled(in, prev);
      // Blocking pairs: even ranks send first, odd ranks receive first (an odd ring closes too).
      Tensor in2 = Tensor::empty({static_cast<int64_t>(count)}, t);
      if (r % 2 == 0) {
        g.send(out, next);
        g.recv(in2, prev);
      } else {
        g.recv(in2, prev);
        g.send(out, next);
      }
      expect_filled(in2, prev);
    }
  }
}

TEST(P2P, AsyncOverlapsAndCounts) {
  const auto& g = test::world().group();
  const int n = g.size(), r = g.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  g.barrier();
  test::world().reset_counters();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor out = test::filled(DType::kBF16, 4096, r), in = Tensor::empty({4096}, DType::kBF16);
  comm::Work w = g.sendrecv_async(out, next, in, prev);
  double busy = 0;  // the caller computes while the worker moves the data
  for (int i = 0; i < 100000; ++i) busy += std::sqrt(static_cast<double>(i));
  w.wait();
  EXPECT_GT(busy, 0);
  expect_filled(in, prev);
  // Pairs posted as two async ops in a matching order complete too.
  Tensor a = test::filled(DType::kF32, 100, r), b = Tensor::empty({100}, DType::kF32);
  if (r == 0) {
    comm::Work s = g.send_async(a, 1);
    comm::Work q = g.recv_async(b, 1);
    s.wait();
    q.wait();
    expect_filled(b, 1);
  } else if (r == 1) {
    comm::Work q = g.recv_async(b, 0);
    comm::Work s = g.send_async(a, 0);
    q.wait();
    s.wait();
    expect_filled(b, 0);
  }
  const comm::CommCounters c = g.counters();
  const uint64_t pair_bytes = r < 2 ? 100 * 4 : 0;
  EXPECT_EQ(c.bytes_sent, 4096 * 2 + pair_bytes);
  EXPECT_EQ(c.bytes_received, 4096 * 2 + pair_bytes);
  uint64_t sends = 0, recvs = 0, sendrecvs = 0;
  for (const comm::OpStats& s : g.op_stats()) {
    if (s.name == "send") sends = s.count;
    if (s.name == "recv") recvs = s.count;
    if (s.name == "sendrecv") {
      sendrecvs = s.count;
      EXPECT_EQ(s.bytes_sent, 4096u * 2);
    }
  }
  EXPECT_EQ(sendrecvs, 1u);
  EXPECT_EQ(sends, r < 2 ? 1u : 0u);
  EXPECT_EQ(recvs, r < 2 ? 1u : 0u);
  g.barrier();
}

// Megatron's 1F1B schedule without interleaving (schedules.py, forward_backward_pipelining_without_
// interleaving) over the world as a pipeline of size() stages, with M micro-batches: stage s adds s+1
// to each micro-batch's activation on the way forward and the last stage returns the activation as
// its gradient, which every stage passes back adding 1000. Blocking send/recv and the two sendrecv
// exchanges of the steady state; every value is checked on arrival.
TEST(P2P, OneFOneBPipelineScheduleCompletes) {
  const auto& g = test::world().group();
  const int stages = g.size(), s = g.rank();
  if (stages < 2) GTEST_SKIP() << "needs two ranks";
  const int m = 5;
  const bool first = s == 0, last = s == stages - 1;
  auto scalar = [](float v) {
    Tensor t = Tensor::empty({8}, DType::kF32);
    for (int i = 0; i < 8; ++i) t.data<float>()[i] = v + static_cast<float>(i);
    return t;
  };
  auto forward_in = [&](int mb) { return static_cast<float>(mb * 100 + s * (s + 1) / 2); };  // sum of 1..s
  auto total = static_cast<float>(stages * (stages + 1) / 2);
  auto grad_in = [&](int mb) { return static_cast<float>(mb * 100) + total + 1000.0f * static_cast<float>(stages - 1 - s); };
  auto check = [&](const Tensor& t, float v) {
    for (int i = 0; i < 8; ++i) ASSERT_EQ(t.data<float>()[i], v + static_cast<float>(i)) << "stage " << s;
  };
  auto recv_forward = [&](int mb) {
    Tensor t = scalar(0);
    if (!first) g.recv(t, s - 1);
    else t = scalar(static_cast<float>(mb * 100));
    check(t, forward_in(mb));
    return t;
  };
  auto fwd = [&](const Tensor& in) {
    Tensor out = scalar(0);
    for (int i = 0; i < 8; ++i) out.data<float>()[i] = in.data<float>()[i] + static_cast<float>(s + 1);
    return out;
  };
  auto bwd = [&](const Tensor& grad) {
    Tensor out = scalar(0);
    for (int i = 0; i < 8; ++i) out.data<float>()[i] = grad.data<float>()[i] + 1000.0f;
    return out;
  };
  int fwd_mb = 0, bwd_mb = 0;
  const int warmup = std::min(stages - s - 1, m), remaining = m - warmup;
  for (int i = 0; i < warmup; ++i) {
    Tensor out = fwd(recv_forward(fwd_mb++));
    g.send(out, s + 1);  // never the last stage: warmup is 0 there
  }
  Tensor input;
  if (remaining > 0) input = recv_forward(fwd_mb++);
  for (int i = 0; i < remaining; ++i) {
    Tensor out = fwd(input);
    Tensor grad = scalar(0);
    if (last) {
      grad = out;  // the loss's gradient: the activation itself
    } else {
      g.sendrecv(out, s + 1, grad, s + 1);  // send_forward_recv_backward
    }
    check(grad, grad_in(bwd_mb));
    Tensor input_grad = bwd(grad);
    ++bwd_mb;
    if (i == remaining - 1) {
      if (!first) g.send(input_grad, s - 1);
    } else if (first) {
      input = recv_forward(fwd_mb++);
    } else {
      Tensor next = scalar(0);
      g.sendrecv(input_grad, s - 1, next, s - 1);  // send_backward_recv_forward
      check(next, forward_in(fwd_mb++));
      input = next;
    }
  }
  for (int i = 0; i < warmup; ++i) {
    Tensor grad = scalar(0);
    g.recv(grad, s + 1);
    check(grad, grad_in(bwd_mb++));
    Tensor input_grad = bwd(grad);
    if (!first) g.send(input_grad, s - 1);
  }
  EXPECT_EQ(fwd_mb, m);
  EXPECT_EQ(bwd_mb, m);
  g.barrier();
}

TEST(P2P, BadPeerThrowsAtOnce) {
  const auto& g = test::world().group();
  Tensor x = Tensor::empty({4}, DType::kF32);
  try {
    g.send(x, g.rank());
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "the peer is this rank itself")) << e.what();
    EXPECT_TRUE(contains(e.what(), "send(fp32, 4 elements to rank")) << e.what();
  }
  EXPECT_THROW(g.recv(x, g.size()), CommError);
  EXPECT_THROW(g.recv(x, -1), CommError);
  g.barrier();  // the group is still usable: nothing was posted
}

// Note [Prompt mismatches] in timeout_test.cpp: a 30 s timeout, an error on both ranks well within it.
constexpr double kPrompt = 5.0;

void expect_prompt(const char* what, const std::function<void(const comm::Group&, int)>& call,
                   const std::vector<std::string>& parts) {
  comm::Group p = pair("p2pmismatch", 30.0);
  const int r = test::world().rank();
  if (r < 2) {
    const auto start = std::chrono::steady_clock::now();
    try {
      call(p, r);
      ADD_FAILURE() << what << ": rank " << r << " expected a CommError";
    } catch (const CommError& e) {
      EXPECT_LT(since(start), kPrompt) << what << ": " << e.what();
      for (const std::string& part : parts) EXPECT_TRUE(contains(e.what(), part)) << what << ": '" << part << "' in " << e.what();
      EXPECT_TRUE(contains(e.what(), "group 'p2pmismatch'")) << e.what();
    }
  }
  test::world().group().barrier();
}

TEST(P2P, MismatchesFailAtOnceOnBothRanks) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  expect_prompt("size", [](const comm::Group& p, int r) {
    if (r == 0) p.send(Tensor::empty({10}, DType::kF32), 1); else p.recv(Tensor::empty({11}, DType::kF32), 0);
  }, {"mismatched send/recv", "10 elements", "11 elements"});
  expect_prompt("dtype", [](const comm::Group& p, int r) {
    if (r == 0) p.send(Tensor::empty({64}, DType::kF32), 1); else p.recv(Tensor::empty({64}, DType::kBF16), 0);
  }, {"mismatched send/recv", "fp32", "bf16"});
  // Both send first (or both receive first): each waits for the other's next op, a certain deadlock.
  expect_prompt("both send", [](const comm::Group& p, int r) {
    p.send(Tensor::empty({16}, DType::kF32), 1 - r);
  }, {"deadlock", "send(fp32, 16 elements to rank"});
  expect_prompt("both receive", [](const comm::Group& p, int r) {
    p.recv(Tensor::empty({16}, DType::kI32), 1 - r);
  }, {"deadlock", "recv(int32, 16 elements from rank"});
  // A transfer on one rank against a collective on the other (Note [Waits across groups]).
  expect_prompt("send vs allreduce", [](const comm::Group& p, int r) {
    if (r == 0) p.send(Tensor::empty({16}, DType::kF32), 1); else p.allreduce(Tensor::empty({16}, DType::kF32));
  }, {"mismatched calls", "send(fp32, 16 elements to rank 1", "allreduce(fp32, 16 elements"});
  expect_prompt("async recv vs barrier", [](const comm::Group& p, int r) {
    if (r == 0) p.recv_async(Tensor::empty({4}, DType::kI32), 1).wait(); else p.barrier();
  }, {"mismatched calls", "recv(int32, 4 elements from rank 1", "barrier"});
  // A mismatch found with nothing else posted leaves the group usable.
  comm::Group p = pair("p2pusable", 30.0);
  if (test::world().rank() < 2) {
    const int r = test::world().rank();
    EXPECT_THROW(r == 0 ? p.send(Tensor::empty({3}, DType::kF32), 1) : p.recv(Tensor::empty({4}, DType::kF32), 0), CommError);
    Tensor x = test::filled(DType::kF32, 5, r), y = Tensor::empty({5}, DType::kF32);
    p.sendrecv(x, 1 - r, y, 1 - r);
    expect_filled(y, 1 - r);
  }
  test::world().group().barrier();
}

// Waiting is not a deadlock: a slow peer, a third rank in a collective that waits for a transfer to
// end, and a notice of a transfer that has since completed (Note [Waits across groups]) must pass.
TEST(P2P, SlowPeersAreNotDeadlocks) {
  const auto& world = test::world().group();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  const int r = world.rank();
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); };
  Tensor x = test::filled(DType::kF32, 64, r), y = Tensor::empty({64}, DType::kF32);
  if (r == 0) {
    world.send(x, 1);  // waits 400 ms: announces it to rank 1
    pause();           // rank 1 waits in the allreduce, reading rank 0's (now stale) notice
    world.allreduce(y);
  } else if (r == 1) {
    pause();
    world.recv(y, 0);
    expect_filled(y, 0);
    world.allreduce(y);
  } else {
    world.allreduce(y);  // waits for ranks 0 and 1 to finish their transfer
  }
  // A receive posted long before its send, on the comm worker, while the caller computes.
  if (r < 2) {
    comm::Work w = r == 0 ? world.recv_async(y, 1) : comm::Work();
    if (r == 1) {
      pause();
      world.send(x, 0);
    }
    w.wait();
    if (r == 0) expect_filled(y, 1);
  }
  world.barrier();
}

// A stopped peer (SIGSTOP: a frozen node) during a receive: the receiver throws after comm.timeout_s,
// naming the op, the group, the peer and the sizes; then it wakes the peer, whose send fails too.
TEST(P2P, StoppedPeerTimesOut) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  const auto& world = test::world().group();
  Tensor pid = Tensor::empty({1}, DType::kI32), pids = Tensor::empty({world.size()}, DType::kI32);
  pid.data<int32_t>()[0] = static_cast<int32_t>(getpid());
  world.allgather(pid, pids);
  comm::Group p = pair("stoppair", 1.0);
  const int r = world.rank();
  Tensor x = Tensor::empty({1234}, DType::kF32);
  if (r == 0) {
    const auto start = std::chrono::steady_clock::now();
    try {
      p.recv(x, 1);
      ADD_FAILURE() << "expected a timeout";
    } catch (const CommError& e) {
      const std::string m = e.what();
      EXPECT_LT(since(start), 1.0 + kPrompt) << m;
      EXPECT_TRUE(contains(m, "recv(fp32, 1234 elements from rank 1 (world rank 1))")) << m;
      EXPECT_TRUE(contains(m, "group 'stoppair'")) << m;
      EXPECT_TRUE(contains(m, "timed out")) << m;
      EXPECT_TRUE(contains(m, "waiting for rank 1")) << m;
    }
    kill(pids.data<int32_t>()[1], SIGCONT);
    EXPECT_THROW(p.barrier(), CommError);  // unusable after the timeout
  } else if (r == 1) {
    raise(SIGSTOP);  // until rank 0 has timed out
    try {
      p.send(x, 0);  // meets rank 0's abandoned handshake, then nobody takes the data
    } catch (const CommError&) {
    }
  }
  world.barrier();
}

}  // namespace
