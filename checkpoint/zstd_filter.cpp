#include "checkpoint/zstd_filter.h"

#include <hdf5.h>
#include <zstd.h>

#include <memory>

#include "core/errors.h"

namespace zs::checkpoint {
namespace {

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// One context per thread: HDF5 may be called from an async saver thread and the caller's at once.
ZSTD_CCtx* thread_cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CctxFree> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* thread_dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DctxFree> ctx(ZSTD_createDCtx());
  return ctx.get();
}

// HDF5's filter contract: return the new data size with *buf (H5allocate_memory'd) replaced, or 0 on
// failure (HDF5 then reports the chunk as unreadable or unwritable, and ZS_H5_CHECK names the file).
size_t zstd_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes, size_t* buf_size,
                   void** buf) {
  if ((flags & H5Z_FLAG_REVERSE) != 0) {
    unsigned long long content = ZSTD_getFrameContentSize(*buf, nbytes);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
    void* out = H5allocate_memory(content, false);
    if (out == nullptr) return 0;
    size_t got = ZSTD_decompressDCtx(thread_dctx(), out, content, *buf, nbytes);
    if (ZSTD_isError(got) || got != content) {
      H5free_memory(out);
      return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = content;
    return got;
  }
  int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : ZSTD_CLEVEL_DEFAULT;
  ZSTD_CCtx* cctx = thread_cctx();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
  size_t bound = ZSTD_compressBound(nbytes);
  void* out = H5allocate_memory(bound, false);
  if (out == nullptr) return 0;
  size_t size = ZSTD_compress2(cctx, out, bound, *buf, nbytes);
  if (ZSTD_isError(size)) {
    H5free_memory(out);
    return 0;
  }
  H5free_memory(*buf);
  *buf = out;
  *buf_size = bound;
  return size;
}

const H5Z_class2_t kZstdClass = {
    H5Z_CLASS_T_VERS, static_cast<H5Z_filter_t>(kZstdFilterId), 1, 1, "Zstandard (zeroshard)", nullptr, nullptr,
    zstd_filter,
};

}  // namespace

const void* zstd_filter_class() { return &kZstdClass; }

void register_zstd_filter() {
  if (H5Zfilter_avail(kZstdFilterId) > 0) return;
  if (H5Zregister(&kZstdClass) < 0) {
    throw InternalError("HDF5 refused to register the zstd filter (id 32015)");
  }
}

}  // namespace zs::checkpoint
