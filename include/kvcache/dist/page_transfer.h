#pragma once

// Page transfer between caches on two GPUs over NCCL: the optional kvcache::transfer component
// (-DKVCACHE_BUILD_TRANSFER=ON). This header needs no NCCL header: it names the communicator as nccl.h does.
//
// Every quantization is carried (docs/layout.md, "Quantized pages"): a page is its data pages and, with scale pools
// (kFP8_PER_TOKEN_HEAD, kNVFP4), its scale pages, which move with it. Host-held layer scales (kFP8_PER_TENSOR, NVFP4's
// global scales) do not move: they stay in each manager, and a transfer between caches whose scales differ is
// refused, since the receiver would read the pages under other scales.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

//! NCCL's communicator handle, declared exactly as nccl.h declares it, so that both may be included.
typedef struct ncclComm* ncclComm_t;

namespace kvcache::rt
{

//! How a transfer moves its pages.
enum class TransferPath : int32_t
{
    //! kDIRECT below kSTAGED_TRANSFER_MIN_RUNS runs, else kSTAGED.
    kAUTO = 0,
    //! One ncclSend/ncclRecv per run of pages per layer half, straight from and into the pools.
    kDIRECT = 1,
    //! Pages packed by a copy kernel into one staging buffer, sent as one message and unpacked on the other side.
    kSTAGED = 2,
};

//! Runs (stretches where the sender's and the receiver's page ids both go up by one) from which kAUTO packs the pages
//! into a staging buffer instead of posting one NCCL operation per run and layer half; docs/benchmarks.md gives the
//! measurement behind it.
inline constexpr int32_t kSTAGED_TRANSFER_MIN_RUNS = 16;
//! Default TransferOptions::timeoutMs.
inline constexpr int64_t kDEFAULT_TRANSFER_TIMEOUT_MS = 30000;

//! What sendPages and receivePages may vary; both sides must pass the same path.
struct TransferOptions
{
    //! How long a call waits for the peer (each exchange and the pages) before it aborts the communicator; > 0.
    int64_t timeoutMs = kDEFAULT_TRANSFER_TIMEOUT_MS;
    TransferPath path = TransferPath::kAUTO;
};

//! Why a transfer failed.
enum class TransferFailure : int32_t
{
    //! The peer's cache has another geometry or quantization, or other host-held layer scales in the group, or the peer
    //! asked for another group, page count or path; nothing was sent or written.
    kMISMATCH = 0,
    //! The peer did not finish within TransferOptions::timeoutMs; the communicator was aborted.
    kTIMEOUT = 1,
    //! NCCL reported an error (a peer that died, a broken link); the communicator was aborted.
    kCOMMUNICATION = 2,
};

//! Thrown when a transfer fails after its arguments were accepted. Unless failure() is kMISMATCH:
//! - the communicator was aborted with ncclCommAbort, which also frees it: the caller must not use it again (not even
//!   to abort or destroy it) and must make a new one with the peer;
//! - the NCCL kernels the call queued on its stream end because of the abort; the call waited (polling, at most a few
//!   seconds) for the stream to drain before throwing, and streamDrained() says whether it did. When it did, the stream
//!   is idle and usable. When it did not, the stream still holds work that may never end: abandon it (destroy it
//!   without synchronizing it; no cudaStreamSynchronize or cudaDeviceSynchronize while it is pending), and keep the
//!   cache alive: its pools are freed in order on the cache's own stream, and that work may still address them;
//! - the cache's bookkeeping (sequences, page tables, free pages) is untouched, and the sending side's pages are
//!   unchanged; the receiving side's listed pages hold unspecified bytes (they are not valid), its other pages are
//!   unchanged.
class TransferError : public Error
{
public:
    //! Builds the error of `failure` with `message`; `streamDrained` says whether the stream was idle when it was
    //! thrown.
    TransferError(TransferFailure failure, std::string const& message, bool streamDrained = true)
        : Error(message)
        , mFailure(failure)
        , mStreamDrained(streamDrained)
    {
    }
    //! Returns why the transfer failed.
    TransferFailure failure() const noexcept
    {
        return mFailure;
    }
    //! Returns true when the listed pages on the receiving side may have been written partly (not valid).
    bool pagesInvalid() const noexcept
    {
        return mFailure != TransferFailure::kMISMATCH;
    }
    //! Returns true when the call's stream had no work left when the error was thrown (always for kMISMATCH); false
    //! means the stream must be abandoned (see the class comment).
    bool streamDrained() const noexcept
    {
        return mStreamDrained;
    }

private:
    TransferFailure mFailure;
    bool mStreamDrained;
};

//! Returns the 64-bit FNV-1a hash (offset basis 14695981039346656037, prime 1099511628211) of this byte encoding of
//! `layout`: little-endian uint32 values 3 (the encoding's version) and the number of page groups, then each group's
//! pageGeometryFingerprint (kvcache/core/page_geometry.h) as a little-endian uint64, in group order. Page counts are
//! left out: the two caches may have pools of different sizes. Equal fingerprints mean every group's pages are
//! interchangeable; a page transfer compares only its group's pageGeometryFingerprint.
uint64_t geometryFingerprint(KVCacheLayout const& layout) noexcept;

//! Sends `count` pages of page group `group` of `cache` (ids `pageIds`, a host list), every layer of the group and both
//! halves, data then (with scale pools) scales, to rank `peer` of `comm`, on `stream` (of cache.device()); the peer
//! must call receivePages with the same count and group at the same time. First the two sides exchange a header (the
//! group's pageGeometryFingerprint, the quantization, a hash of the bits of the group's host-held layer scales, a
//! latent layer's unused V scale left out, group, count, path) and, unless the path is kSTAGED, their page lists; a
//! mismatch throws TransferError kMISMATCH on both sides, naming what differs, before any page moves. Then the pages go
//! as runs (kDIRECT: a run per layer half, data and scale halves alike) or one packed message (kSTAGED), all inside one
//! ncclGroupStart/ncclGroupEnd. The call waits on the host until the pages have left, only ever polling (the stream and
//! ncclCommGetAsyncError; it never blocks on the stream, so a peer that never posts cannot hang it); past
//! options.timeoutMs it calls ncclCommAbort and throws TransferError kTIMEOUT, and an NCCL or stream error aborts and
//! throws kCOMMUNICATION; TransferError says what state the communicator, the stream and the pages are left in. Works
//! with blocking and non-blocking (blocking = 0) communicators; with a blocking one, ncclGroupEnd may itself block
//! until the peer connects, outside the timeout. Throws InvalidArgumentError (group outside [0, numGroups), count < 0,
//! a null list with a positive count, a page listed twice, peer outside [0, ranks) or the caller's own rank, timeoutMs
//! <= 0) or OutOfRangeError (an id outside [0, numPages)) before touching the communicator. Zero pages still exchange
//! the header.
void sendPages(KVCacheManager const& cache, int32_t group, int32_t const* pageIds, int32_t count, int32_t peer,
    ncclComm_t comm, cudaStream_t stream, TransferOptions const& options = {});

//! Receives `count` pages of page group `group` from rank `peer` into `cache`'s pages `pageIds` (the i-th page sent
//! lands in pageIds[i]), every layer of the group and both halves, data and scales, on `stream`; the counterpart of
//! sendPages, with the same checks, waiting and failures. The listed pages are valid once it returns; after a
//! TransferError other than kMISMATCH they are not. The cache's host-held layer scales are not changed: they must
//! already equal the sender's (else kMISMATCH).
void receivePages(KVCacheManager const& cache, int32_t group, int32_t const* pageIds, int32_t count, int32_t peer,
    ncclComm_t comm, cudaStream_t stream, TransferOptions const& options = {});

} // namespace kvcache::rt
