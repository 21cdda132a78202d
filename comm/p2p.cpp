// Point-to-point transfers of Group: send, recv, sendrecv (declared in comm/group.h).
//
// Note [Point-to-point]
// A transfer goes through the World's executor like a collective (Note [Execution model] in
// comm/detail/runtime.h): one op at a time, in submission order, timed, counted and tallied. Only two
// ranks take part, so it has no group handshake and no op index (Op::pairwise); instead:
//  - Pairwise handshake: the sender sends its signature {dtype, numel} to the receiver (kSignatureTag)
//    and the receiver its own to the sender (kReplyTag), both on the group's private handshake
//    communicator, as nonblocking messages polled with the collectives' policy (Note [Polling]) until
//    comm.timeout_s. MPI keeps messages of one sender, tag and communicator in order, so the k-th
//    send from A to B meets the k-th recv of B from A, as in MPI itself. Both sides compare the two
//    signatures, so a dtype or size mismatch throws CommError on both at once, before any data moves.
//  - Data: MPI_Isend/MPI_Irecv of the bytes (kDataTag, same communicator), polled until the same
//    deadline. A peer that stops (SIGSTOP) or dies (SIGKILL under a launcher that leaves the others
//    running) therefore ends this side with a CommError naming the op, the group, the peer and the
//    sizes after comm.timeout_s, not a hang; the group is then unusable, as after a collective's timeout.
// Tags 3, 5 and 6 are not powers of two, so they never match a handshake round's tag k (Note
// [Handshake lengths]); the handshake communicator never carries a user's messages.
//
// Ordering contract (as MPI's synchronous sends): every op waits for its peer, and ops run one at a
// time, so a rank whose next op is send(B) while B's next op is send(A) would wait for ever. Post
// matching pairs (one side receives first: even ranks send then receive, odd ranks the reverse) or
// put both directions in one op: sendrecv (and sendrecv_async) posts the send and the receive
// together and progresses each on its own, so two ranks exchanging with each other - or a pipeline's
// 1F1B steady state, send_forward_recv_backward against send_backward_recv_forward - complete. Two
// separate async calls (send_async then recv_async) are two ops and run in turn like sync ones.
// Such a deadlock is found, not waited out (Note [Crossed transfers]), and so is a send or receive on
// one rank against a collective on the other, each waiting for the other (Note [Waits across groups]
// in comm/detail/wait_notices.h).
//
// Note [Crossed transfers]
// When an op's handshake with a peer P has waited kCrossedAfter, it looks (MPI_Iprobe) for a message
// from P that no posted receive took: a signature (P is sending to this rank) while this rank's own
// transfer to P is a send, or a reply (P is receiving from this rank) while this one is a receive. P
// sent it from the op it is blocked in, and this rank's op has no transfer that matches it (its
// receive would have been posted and taken the message), so each rank waits for an op of the other
// that can only come after the one it is in: a certain deadlock, reported on both ranks. A batch
// posts its replies before its signatures and MPI delivers one sender's messages to a receiver in
// order in OpenMPI's transports, so seeing P's signature means P's replies of that op have arrived;
// the condition must also hold at two checks kConfirm apart, which a message in flight never does.
#include <mpi.h>

#include <array>
#include <chrono>
#include <climits>
#include <memory>
#include <utility>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/group.h"
#include "comm/mpi_check.h"
#include "core/errors.h"
#include "memory/dtype.h"

namespace zs::comm {

namespace {

using detail::Op;
using detail::OpCode;
using Clock = std::chrono::steady_clock;

constexpr int kSignatureTag = 3;  // sender -> receiver: {dtype, numel}
constexpr int kReplyTag = 5;      // receiver -> sender: {dtype, numel}
constexpr int kDataTag = 6;
constexpr auto kCrossedAfter = std::chrono::milliseconds(100);
constexpr auto kConfirm = std::chrono::milliseconds(50);

struct Transfer {
  bool send = false;
  int peer = 0;
  memory::Tensor data;
  std::array<int64_t, 2> mine{}, theirs{};
  std::array<MPI_Request, 2> handshake{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  MPI_Request transfer = MPI_REQUEST_NULL;
  enum class State { kHandshake, kData, kDone } state = State::kHandshake;
  bool counted = false;  // in GroupState::p2p_done
};

// The transfers of one op and their MPI buffers; kept alive by Runtime::abandon after a failure.
struct Batch {
  std::vector<Transfer> transfers;
};

std::string peer_text(const detail::GroupState& g, int peer) {
  if (peer >= 0 && peer < g.size && g.world_ranks.size() == static_cast<size_t>(g.size)) {
    return fmt::format("rank {} (world rank {})", peer, g.world_ranks[static_cast<size_t>(peer)]);
  }
  return fmt::format("rank {}", peer);
}

std::string transfer_text(const detail::GroupState& g, const memory::Tensor& t, bool send, int peer) {
  return fmt::format("{}, {} elements {} {}", memory::dtype_name(t.dtype()), t.numel(), send ? "to" : "from",
                     peer_text(g, peer));
}

void check_transfer(const Op& op, const detail::GroupState& g, const memory::Tensor& t, int peer, bool send) {
  const char* role = send ? "send" : "receive";
  if (!t.defined()) op.fail(fmt::format("the {} tensor is undefined; pass a tensor with storage", role));
  if (!t.is_contiguous()) op.fail(fmt::format("the {} tensor is not contiguous; pass a contiguous view", role));
  if (peer < 0 || peer >= g.size) {
    op.fail(fmt::format("peer rank {} is outside the group of {} ranks; pass a rank in 0..{}", peer, g.size, g.size - 1));
  }
  if (peer == g.rank) {
    op.fail(fmt::format("the peer is this rank itself ({}); send and recv move data between two different ranks "
                         "of the group (copy the tensor instead)",
                         peer));
  }
  if (t.nbytes() > static_cast<size_t>(INT_MAX)) {
    op.fail(fmt::format("{} bytes exceed MPI's int count; split the tensor into pieces of at most {} bytes",
                         t.nbytes(), INT_MAX));
  }
}

void post_handshake(const Op& op, const detail::GroupState& g, Transfer& t) {
  // The sender's signature travels on kSignatureTag, the receiver's reply on kReplyTag.
  const int out_tag = t.send ? kSignatureTag : kReplyTag, in_tag = t.send ? kReplyTag : kSignatureTag;
  ZS_MPI_CHECK(MPI_Irecv(t.theirs.data(), 2, MPI_INT64_T, t.peer, in_tag, g.handshake_comm, &t.handshake[0]),
               "{}: posting the handshake receive", op.describe());
  ZS_MPI_CHECK(MPI_Isend(t.mine.data(), 2, MPI_INT64_T, t.peer, out_tag, g.handshake_comm, &t.handshake[1]),
               "{}: posting the handshake send", op.describe());
}

// Leaves what is still posted to MPI (Runtime::abandon) and marks the group unusable when the pair's
// message streams are out of step; a mismatch found with nothing posted leaves the group usable.
void give_up(detail::Runtime& runtime, detail::GroupState& g, const Op& op, const std::shared_ptr<Batch>& batch,
             const std::string& why) {
  std::vector<MPI_Request> pending;
  for (Transfer& t : batch->transfers) {
    if (t.transfer != MPI_REQUEST_NULL && !t.send) MPI_Cancel(&t.transfer);  // it would write the caller's tensor
    for (MPI_Request& r : t.handshake) {
      if (r != MPI_REQUEST_NULL) pending.push_back(std::exchange(r, MPI_REQUEST_NULL));
    }
    if (t.transfer != MPI_REQUEST_NULL) pending.push_back(std::exchange(t.transfer, MPI_REQUEST_NULL));
  }
  if (pending.empty()) return;
  g.mark_broken(fmt::format("{} {}", detail::op_name(op.code), why));
  runtime.abandon(std::move(pending), batch);
}

// An unmatched message from t.peer that shows a crossed transfer (Note [Crossed transfers]).
// Tests the handshake again after the probe: a completed one goes on at the next poll.
bool crossed(const Op& op, const detail::GroupState& g, Transfer& t) {
  int found = 0;
  ZS_MPI_CHECK(MPI_Iprobe(t.peer, t.send ? kSignatureTag : kReplyTag, g.handshake_comm, &found, MPI_STATUS_IGNORE),
               "{}: probing the peer's messages", op.describe());
  if (!found) return false;
  int done = 0;
  ZS_MPI_CHECK(MPI_Testall(2, t.handshake.data(), &done, MPI_STATUSES_IGNORE), "{}: MPI_Testall of the handshake",
               op.describe());
  return !done;
}

void poll_batch(detail::Runtime& runtime, detail::GroupState& g, Op& op, const std::shared_ptr<Batch>& batch) {
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(g.config.timeout_s));
  // Replies first (Note [Crossed transfers]).
  for (Transfer& t : batch->transfers) {
    if (!t.send) post_handshake(op, g, t);
  }
  for (Transfer& t : batch->transfers) {
    if (t.send) post_handshake(op, g, t);
  }
  // Note [Waits across groups]: each transfer's index among this rank's transfers with its peer.
  if (g.p2p_done.size() != static_cast<size_t>(g.size)) g.p2p_done.assign(static_cast<size_t>(g.size), {0, 0});
  std::vector<int64_t> index;
  for (const Transfer& t : batch->transfers) index.push_back(g.p2p_done[static_cast<size_t>(t.peer)][t.send ? 0 : 1]);
  auto check_at = start + kCrossedAfter;
  detail::SpinProbe probe(start);  // Note [Polling]
  bool announced = false;
  std::vector<bool> suspect(batch->transfers.size(), false);
  while (true) {
    bool all_done = true;
    for (Transfer& t : batch->transfers) {
      if (t.state == Transfer::State::kHandshake) {
        int done = 0;
        ZS_MPI_CHECK(MPI_Testall(2, t.handshake.data(), &done, MPI_STATUSES_IGNORE), "{}: MPI_Testall of the handshake",
                     op.describe());
        if (done) {
          if (t.theirs != t.mine) {
            const std::string message = fmt::format(
                "{}: mismatched send/recv: this rank {} {} {} elements of {} while {} {} {} elements of {}; the sender "
                "and the receiver must pass the same dtype and element count",
                op.describe(), t.send ? "sends" : "receives", t.send ? "to" : "from", t.mine[1],
                memory::dtype_name(static_cast<memory::DType>(t.mine[0])), peer_text(g, t.peer),
                t.send ? "receives" : "sends", t.theirs[1], memory::dtype_name(static_cast<memory::DType>(t.theirs[0])));
            give_up(runtime, g, op, batch, "mismatched its peer's transfer");
            throw CommError(message);
          }
          if (t.data.numel() == 0) {
            t.state = Transfer::State::kDone;
          } else {
            const int bytes = static_cast<int>(t.data.nbytes());
            if (t.send) {
              ZS_MPI_CHECK(MPI_Isend(t.data.raw(), bytes, MPI_BYTE, t.peer, kDataTag, g.handshake_comm, &t.transfer),
                           "{}: posting the send", op.describe());
            } else {
              ZS_MPI_CHECK(MPI_Irecv(t.data.raw(), bytes, MPI_BYTE, t.peer, kDataTag, g.handshake_comm, &t.transfer),
                           "{}: posting the receive", op.describe());
            }
            t.state = Transfer::State::kData;
          }
        }
      }
      if (t.state == Transfer::State::kData) {
        int done = 0;
        ZS_MPI_CHECK(MPI_Test(&t.transfer, &done, MPI_STATUS_IGNORE), "{}: MPI_Test of the transfer", op.describe());
        if (done) t.state = Transfer::State::kDone;
      }
      if (t.state == Transfer::State::kDone && !t.counted) {
        ++g.p2p_done[static_cast<size_t>(t.peer)][t.send ? 0 : 1];
        t.counted = true;
      }
      all_done = all_done && t.state == Transfer::State::kDone;
    }
    if (all_done) return;
    const auto now = Clock::now();
    if (now >= deadline) [[unlikely]] {
      std::string waiting;
      for (const Transfer& t : batch->transfers) {
        if (t.state == Transfer::State::kDone) continue;
        const bool paired = t.state == Transfer::State::kData;
        const char* what = t.send ? (paired ? "take the data" : "post the matching recv")
                                  : (paired ? "deliver the data" : "post the matching send");
        waiting += fmt::format("{}{} to {}", waiting.empty() ? "" : "; ", peer_text(g, t.peer), what);
      }
      const std::string message = fmt::format(
          "{} timed out after {} s waiting for {} (comm.timeout_s = {}): the peer is stuck, has failed, or posted a "
          "different sequence of sends and receives; check the other ranks' errors, or raise comm.timeout_s if the "
          "peer legitimately computes longer",
          op.describe(), g.config.timeout_s, waiting, g.config.timeout_s);
      give_up(runtime, g, op, batch, "timed out");
      throw CommError(message);
    }
    if (now >= check_at) [[unlikely]] {  // Note [Crossed transfers]
      check_at = now + kConfirm;
      for (size_t i = 0; i < batch->transfers.size(); ++i) {
        Transfer& t = batch->transfers[i];
        const bool now_crossed = t.state == Transfer::State::kHandshake && crossed(op, g, t);
        if (now_crossed && suspect[i]) {
          const std::string message = fmt::format(
              "{}: deadlock: this rank {} {} while {} is itself {} this rank in the op it waits in, and neither can "
              "reach the other's matching call; post matching pairs (one side receives first) or pass both "
              "directions to one sendrecv call",
              op.describe(), t.send ? "sends to" : "receives from", peer_text(g, t.peer), peer_text(g, t.peer),
              t.send ? "sending to" : "receiving from");
          give_up(runtime, g, op, batch, "deadlocked with its peer");
          throw CommError(message);
        }
        suspect[i] = now_crossed;
      }
      // A peer waiting in a collective this rank has not reached (Note [Waits across groups]).
      if (detail::WaitNotices* notices = runtime.notices(); notices != nullptr) {
        std::vector<detail::WaitNotices::PendingTransfer> pending;
        for (size_t i = 0; i < batch->transfers.size(); ++i) {
          const Transfer& t = batch->transfers[i];
          if (t.state != Transfer::State::kDone) pending.push_back({t.peer, t.send, index[i]});
        }
        if (!announced) notices->announce_pairwise(op, pending);
        announced = true;
        const std::string failure = notices->find_pairwise_deadlock(op, pending);
        if (!failure.empty()) {
          give_up(runtime, g, op, batch, "deadlocked with its peer's collective");
          throw CommError(failure);
        }
      }
    }
    runtime.pause(op.on_worker, probe);
  }
}

// An MPI error (a peer that died, under a launcher that lets the others run) leaves requests posted too.
void run_batch(detail::Runtime& runtime, detail::GroupState& g, Op& op, const std::shared_ptr<Batch>& batch) {
  try {
    poll_batch(runtime, g, op, batch);
  } catch (...) {
    give_up(runtime, g, op, batch, "failed");  // nothing left to do when the failure already did it
    throw;
  }
}

struct Part {
  memory::Tensor data;
  int peer;
  bool send;
};

std::shared_ptr<Op> p2p_op(const std::shared_ptr<detail::GroupState>& g, std::vector<Part> parts) {
  auto op = std::make_shared<Op>();
  op->code = parts.size() == 2 ? OpCode::kSendRecv : parts[0].send ? OpCode::kSend : OpCode::kRecv;
  op->group = g;
  op->pairwise = true;
  std::vector<std::string> texts;
  for (const Part& p : parts) texts.push_back(transfer_text(*g, p.data, p.send, p.peer));
  op->sizes = fmt::format("{}", fmt::join(texts, " / "));
  auto batch = std::make_shared<Batch>();
  for (Part& p : parts) {
    check_transfer(*op, *g, p.data, p.peer, p.send);
    (p.send ? op->bytes_sent : op->bytes_received) += p.data.nbytes();
    if (p.send && g->remote(p.peer)) op->bytes_inter_host += p.data.nbytes();  // Note [Bytes across hosts]
    Transfer t;
    t.send = p.send;
    t.peer = p.peer;
    t.data = std::move(p.data);
    t.mine = {static_cast<int64_t>(t.data.dtype()), t.data.numel()};
    batch->transfers.push_back(std::move(t));
  }
  op->body = [g = g.get(), batch, o = op.get()] { run_batch(*g->runtime, *g, *o, batch); };
  return op;
}

}  // namespace

void Group::send(const Tensor& data, int dst) const { state_->runtime->run(p2p_op(state_, {{data, dst, true}})); }
void Group::recv(const Tensor& data, int src) const { state_->runtime->run(p2p_op(state_, {{data, src, false}})); }
Work Group::send_async(const Tensor& data, int dst) const {
  return state_->runtime->submit(p2p_op(state_, {{data, dst, true}}));
}
Work Group::recv_async(const Tensor& data, int src) const {
  return state_->runtime->submit(p2p_op(state_, {{data, src, false}}));
}
void Group::sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) const {
  state_->runtime->run(p2p_op(state_, {{send, dst, true}, {recv, src, false}}));
}
Work Group::sendrecv_async(const Tensor& send, int dst, const Tensor& recv, int src) const {
  return state_->runtime->submit(p2p_op(state_, {{send, dst, true}, {recv, src, false}}));
}

}  // namespace zs::comm
