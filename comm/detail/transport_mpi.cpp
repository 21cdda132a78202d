// The MPI transport: MPI's blocking collectives on the group's communicator (OpenMPI's tuned
// algorithms; Note [Handshake] in comm/detail/runtime.h says why blocking ones). Also the fallback the
// shared-memory transports hand their other cases to (Note [Transports] in comm/detail/transport.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/detail/shm_reduce.h"
#include "comm/detail/transport.h"
#include "comm/mpi_check.h"
#include "memory/dtype.h"
#include "memory/shard.h"

namespace zs::comm::detail {

using memory::DType;

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kI32: return MPI_INT32_T;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;  // moved as bits; reductions go through fp32
  }
  return MPI_BYTE;
}

void scale(float* p, size_t n, int size) {
  const float d = static_cast<float>(size);
  for (size_t i = 0; i < n; ++i) p[i] /= d;
}

bool wide(DType t) { return t == DType::kF32 || t == DType::kI32; }  // MPI sums these itself

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, int rank, int size, std::string context, bool ordered)
      : comm_(comm), rank_(rank), size_(size), context_(std::move(context)), ordered_(ordered) {}
  const char* name() const override { return "mpi"; }

  void allreduce(const Op& op, const memory::Tensor& data, ReduceOp r) override {
    const DType t = data.dtype();
    const size_t n = static_cast<size_t>(data.numel());
    if (!direct(t)) {
      ZS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.raw(), static_cast<int>(n), mpi_type(t), MPI_SUM, comm_), "{}{}",
                   op.describe(), context_);
      if (r == ReduceOp::kAverage) scale(data.data<float>(), n, size_);
      return;
    }
    // 16-bit (or ordered fp32): the values travel as they are, summed in fp32 per block in rank order
    // (Note [16-bit reductions]).
    Counts c;
    for (const memory::ShardRange& s : memory::partition(n, size_)) {
      c.counts.push_back(static_cast<int>(s.size));
      c.displs.push_back(static_cast<int>(s.offset));
    }
    c.total = n;
    const size_t displ = static_cast<size_t>(c.displs[static_cast<size_t>(rank_)]);
    auto* base = static_cast<char*>(data.raw());
    reduce_scatter_direct(op, base, base + displ * memory::dtype_size(t), t, c, r);
    ZS_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, c.counts.data(), c.displs.data(), mpi_type(t),
                                comm_),
                 "{}{}", op.describe(), context_);
  }

  void reduce_scatter(const Op& op, const memory::Tensor& input, const memory::Tensor& output, const Counts& c,
                      ReduceOp r) override {
    const DType t = input.dtype();
    const size_t es = memory::dtype_size(t);
    const size_t own = static_cast<size_t>(c.counts[static_cast<size_t>(rank_)]);
    const size_t displ = static_cast<size_t>(c.displs[static_cast<size_t>(rank_)]);
    auto* in = static_cast<char*>(input.raw());
    auto* out = static_cast<char*>(output.raw());
    if (direct(t)) {
      reduce_scatter_direct(op, in, out, t, c, r);  // Note [16-bit reductions]
      return;
    }
    auto reduce = [&](const void* send, void* recv) {
      if (c.equal()) {
        ZS_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, c.counts[0], mpi_type(t), MPI_SUM, comm_), "{}{}", op.describe(), context_);
      } else {
        ZS_MPI_CHECK(MPI_Reduce_scatter(send, recv, c.counts.data(), mpi_type(t), MPI_SUM, comm_), "{}{}", op.describe(), context_);
      }
    };
    if (out == in + displ * es) {  // in place: MPI leaves the result at the start of the buffer
      reduce(MPI_IN_PLACE, in);
      if (displ > 0 && own > 0) std::memmove(out, in, own * es);
    } else {
      reduce(in, out);
    }
    if (r == ReduceOp::kAverage) scale(output.data<float>(), own, size_);
  }

  void allgatherv(const Op& op, const memory::Tensor& input, const memory::Tensor& output, const Counts& c) override {
    const DType t = input.dtype();
    const size_t es = memory::dtype_size(t);
    const size_t me = static_cast<size_t>(rank_);
    auto* in = static_cast<char*>(input.raw());
    auto* out = static_cast<char*>(output.raw());
    const void* send = in == out + static_cast<size_t>(c.displs[me]) * es ? MPI_IN_PLACE : in;
    const MPI_Datatype type = mpi_type(t);
    if (c.equal()) {
      ZS_MPI_CHECK(MPI_Allgather(send, c.counts[0], type, out, c.counts[0], type, comm_), "{}{}", op.describe(), context_);
    } else {
      ZS_MPI_CHECK(MPI_Allgatherv(send, c.counts[me], type, out, c.counts.data(), c.displs.data(), type, comm_), "{}{}",
                   op.describe(), context_);
    }
  }

  void broadcast(const Op& op, const memory::Tensor& data, int root) override {
    ZS_MPI_CHECK(MPI_Bcast(data.raw(), static_cast<int>(data.numel()), mpi_type(data.dtype()), root, comm_), "{}{}",
                 op.describe(), context_);
  }

  void alltoallv(const Op& op, DType t, const ExchangeSide& send, const Counts& s, const ExchangeSide& recv,
                 const Counts& r, bool uneven) override {
    // Pieces are packed into (and unpacked from) a contiguous buffer; the contiguous form goes as it is.
    const size_t es = memory::dtype_size(t);
    std::vector<unsigned char> packed_in, packed_out;
    const void* send_buf = send.whole.defined() ? send.whole.raw() : nullptr;
    void* recv_buf = recv.whole.defined() ? recv.whole.raw() : nullptr;
    if (send_buf == nullptr) {
      packed_in.resize(s.total * es);
      for (size_t j = 0; j < send.blocks.size(); ++j)
        copy_from_block(send.blocks[j], 0, static_cast<size_t>(s.counts[j]) * es, packed_in.data() + static_cast<size_t>(s.displs[j]) * es);
      send_buf = packed_in.data();
    }
    if (recv_buf == nullptr) {
      packed_out.resize(r.total * es);
      recv_buf = packed_out.data();
    }
    const MPI_Datatype type = mpi_type(t);
    if (!uneven) {
      ZS_MPI_CHECK(MPI_Alltoall(send_buf, s.counts[0], type, recv_buf, r.counts[0], type, comm_), "{}{}", op.describe(), context_);
    } else {
      ZS_MPI_CHECK(MPI_Alltoallv(send_buf, s.counts.data(), s.displs.data(), type, recv_buf, r.counts.data(),
                                 r.displs.data(), type, comm_),
                   "{}{}", op.describe(), context_);
    }
    if (!packed_out.empty()) {
      for (size_t j = 0; j < recv.blocks.size(); ++j)
        copy_to_block(recv.blocks[j], 0, static_cast<size_t>(r.counts[j]) * es, packed_out.data() + static_cast<size_t>(r.displs[j]) * es);
    }
  }

  void allgather_counts(const Op& op, std::span<const int32_t> mine, std::span<int32_t> all) override {
    const int k = static_cast<int>(mine.size());
    ZS_MPI_CHECK(MPI_Allgather(mine.data(), k, MPI_INT32_T, all.data(), k, MPI_INT32_T, comm_),
                 "{}{}: exchanging the counts", op.describe(), context_);
  }

  void alltoall_counts(const Op& op, std::span<const int64_t> send, std::span<int64_t> recv) override {
    const int w = static_cast<int>(send.size() / static_cast<size_t>(size_));
    ZS_MPI_CHECK(MPI_Alltoall(send.data(), w, MPI_INT64_T, recv.data(), w, MPI_INT64_T, comm_), "{}{}", op.describe(), context_);
  }

  void split(const Op& op, int color, int key, GroupState& child) override {
    ZS_MPI_CHECK(MPI_Comm_split(comm_, color, key, &child.comm), "{}{}", op.describe(), context_);
    child.owns_comm = true;
    MPI_Comm_rank(child.comm, &child.rank);
    MPI_Comm_size(child.comm, &child.size);
    child.init_handshake_comm();
  }

 private:
  // Note [16-bit reductions]
  // A bf16/fp16 reduction puts its 16-bit values on the wire (half the bytes of fp32: what
  // communication_data_type bf16/fp16 is for) and still sums in fp32, rounding once. MPI's own
  // reduce-scatter cannot: with MPI_FLOAT the wire carries fp32, and a user-defined MPI_Op on 16-bit
  // values rounds every partial sum of its ring to 16 bits (N-1 roundings). So the MPI path is a direct
  // reduce-scatter: one MPI_Alltoallv hands rank j every rank's block j (the bytes a ring moves, total -
  // own), then rank j sums the N blocks in rank order in fp32 with the shared-memory path's kernels
  // (comm/detail/shm_reduce.h) and rounds once; an allreduce follows it with an allgatherv of the
  // 16-bit results. Both paths therefore give the same bits, on any number of ranks. An `ordered`
  // transport (the hierarchical transport's, Note [Sum order across hosts] in
  // comm/detail/transport_hierarchical.cpp) takes this path for fp32 too: its sums are then in rank
  // order, as the shared-memory transport's are, where MPI's own follow its algorithm.
  // Whether a reduction of `t` takes the direct path below rather than MPI's own.
  bool direct(DType t) const { return !wide(t) || (ordered_ && t == DType::kF32); }

  void reduce_scatter_direct(const Op& op, const char* in, char* out, DType t, const Counts& c, ReduceOp r) const {
    const size_t es = memory::dtype_size(t);
    const size_t me = static_cast<size_t>(rank_), ranks = static_cast<size_t>(size_);
    const int own = c.counts[me];
    // Every other rank's copy of this rank's block, in rank order (this rank's own is read in place).
    std::unique_ptr<char[]> recv(new char[static_cast<size_t>(own) * es * ranks]);
    std::vector<int> send_counts = c.counts, recv_counts(ranks, own), recv_displs(ranks);
    send_counts[me] = recv_counts[me] = 0;
    for (size_t j = 0; j < ranks; ++j) recv_displs[j] = static_cast<int>(j) * own;
    ZS_MPI_CHECK(MPI_Alltoallv(in, send_counts.data(), c.displs.data(), mpi_type(t), recv.get(), recv_counts.data(),
                               recv_displs.data(), mpi_type(t), comm_),
                 "{}{}", op.describe(), context_);
    std::vector<const void*> srcs(ranks);
    for (size_t j = 0; j < ranks; ++j) {
      srcs[j] = j == me ? static_cast<const void*>(in + static_cast<size_t>(c.displs[me]) * es)
                        : recv.get() + j * static_cast<size_t>(own) * es;
    }
    // out may be this rank's block of `in` (in place): reduce_sum reads each element before writing it.
    reduce_sum(srcs, t, out, t, static_cast<size_t>(own), r == ReduceOp::kAverage ? static_cast<float>(size_) : 1.0f);
  }

  MPI_Comm comm_;
  int rank_, size_;
  std::string context_;  // appended to op.describe() in errors
  bool ordered_;         // fp32 sums in rank order too (reduce_scatter_direct)
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, int rank, int size, std::string context, bool ordered) {
  return std::make_unique<MpiTransport>(comm, rank, size, std::move(context), ordered);
}

}  // namespace zs::comm::detail
