#include "offload/aio.h"

#include <fmt/format.h>

#include "core/errors.h"
#include "offload/detail/file_io.h"

namespace zs::offload {

void validate(const AioConfig& cfg, const std::string& json_path) {
  const std::string p = json_path.empty() ? "" : json_path + ".";
  constexpr size_t kMaxBlock = size_t{1} << 30;  // io_uring's read/write length is 32-bit
  if (cfg.block_size < kIoAlignment || cfg.block_size > kMaxBlock || !io_aligned(cfg.block_size)) {
    throw ConfigError(fmt::format("{}block_size: expected a multiple of {} between {} and {} bytes, got {} (DeepSpeed's "
                                  "default is 1048576)", p, kIoAlignment, kIoAlignment, kMaxBlock, cfg.block_size));
  }
  if (cfg.queue_depth < 1 || cfg.queue_depth > 1024) {
    throw ConfigError(fmt::format("{}queue_depth: expected 1..1024, got {} (8 to 32 keep an NVMe drive busy)", p,
                                  cfg.queue_depth));
  }
  if (cfg.thread_count < 1 || cfg.thread_count > 64) {
    throw ConfigError(fmt::format("{}thread_count: expected 1..64 I/O threads per file, got {} (also spelled "
                                  "intra_op_parallelism)", p, cfg.thread_count));
  }
}

AsyncFile::AsyncFile(const std::string& path, const AioConfig& cfg, OpenMode mode)
    : io_(std::make_unique<detail::FileIo>(path, cfg, mode)) {}

AsyncFile::AsyncFile(AsyncFile&& other) noexcept = default;
AsyncFile& AsyncFile::operator=(AsyncFile&& other) noexcept = default;
AsyncFile::~AsyncFile() = default;

Ticket AsyncFile::read_async(uint64_t offset, std::span<std::byte> dst) {
  return Ticket{io_->submit(detail::IoOp::kRead, offset, dst.data(), dst.size())};
}

Ticket AsyncFile::write_async(uint64_t offset, std::span<const std::byte> src) {
  // The kernel only reads from a write's buffer; the engine's block type is shared with reads.
  return Ticket{io_->submit(detail::IoOp::kWrite, offset, const_cast<std::byte*>(src.data()), src.size())};
}

void AsyncFile::wait(Ticket t) { io_->wait(t.id); }
void AsyncFile::wait_all() { io_->wait_all(); }
void AsyncFile::truncate(uint64_t bytes) { io_->truncate(bytes); }
void AsyncFile::sync() { io_->sync(); }
const std::string& AsyncFile::path() const { return io_->path(); }
const AioConfig& AsyncFile::config() const { return io_->config(); }
uint64_t AsyncFile::size() const { return io_->size(); }
bool AsyncFile::direct() const { return io_->direct(); }
AioStats AsyncFile::stats() const { return io_->stats(); }
size_t AsyncFile::requests_in_flight() const { return io_->requests_in_flight(); }
void AsyncFile::set_fault_plan(const FaultPlan& plan) { io_->set_fault_plan(plan); }

}  // namespace zs::offload
