#pragma once

#include "kvcache/core/device_allocation.h"
#include "kvcache/memory/page_ops.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace kvcache::rt
{

//! One sequence's pages in token order and its length in tokens, as a page table is built from.
struct SequencePages
{
    //! numPages page ids of the table's page group, in token order (may be null when numPages is 0). A sliding-window
    //! group's sequence may start with kUNUSED_PAGE_ENTRY entries (pages its window released, as
    //! PageManager::pages() gives them); every entry from the first resident page on must be a page id.
    int32_t const* pages = nullptr;
    //! Pages the sequence has covered, released ones included: any value >= 0 whose resident pages (numPages less the
    //! leading kUNUSED_PAGE_ENTRY entries) are at most maxPagesPerSequence. A windowed group's table is therefore as
    //! wide as the pages its window holds (the group's pagesPerSequence), however long the sequence.
    int32_t numPages = 0;
    //! Tokens of the sequence: [(numPages - 1) * tokensPerPage + 1, numPages * tokensPerPage], or 0 with 0 pages.
    int32_t numTokens = 0;
};

namespace detail
{

//! One device allocation and two pinned host staging regions of the same size, uploaded in turn with one
//! cudaMemcpyAsync each: the buffers behind PageTableBuffers and StepArgumentBuffers. A build writes the region the
//! last upload did not read (beginBuild(), which first waits on the host for that region's own upload, the one before
//! the last, if it has not finished), then uploads a prefix of it (finishBuild()), which makes it the current region:
//! the host copies. On a stream other than the last upload's, the upload is ordered after the last one on the device
//! (cudaStreamWaitEvent, no host wait). The device memory is allocated stream-ordered on the constructor's stream and
//! freed on it. Not thread-safe. Move-only.
class StagedUpload
{
public:
    static constexpr int32_t kREGIONS = 2;

    //! Owns nothing: every pointer is null.
    StagedUpload() noexcept = default;
    //! Allocates `bytes` (> 0) of device memory on `stream`, two pinned regions of `bytes` and their events. Throws
    //! OutOfMemoryError / CudaError from CUDA, having freed what it allocated.
    StagedUpload(int64_t bytes, cudaStream_t stream);
    //! Waits on the host for the last upload from each region, then frees everything; never throws.
    ~StagedUpload() noexcept;
    StagedUpload(StagedUpload const&) = delete;
    StagedUpload& operator=(StagedUpload const&) = delete;
    StagedUpload(StagedUpload&& other) noexcept;
    StagedUpload& operator=(StagedUpload&& other) noexcept;

    //! Throws InvalidArgumentError, naming `what`, when this object owns nothing or `stream` is capturing a graph;
    //! otherwise waits for the upload that last read the next region and returns that region, for the caller to
    //! write. Enqueues nothing.
    void* beginBuild(char const* what, cudaStream_t stream);
    //! Uploads the first `bytes` of the region beginBuild() returned on `stream` and makes it the current one.
    //! Throws CudaError when CUDA fails (the current region is then still the previous one).
    void finishBuild(int64_t bytes, cudaStream_t stream);
    //! Uploads the first `bytes` of region 0 on `stream` and makes it the current one (the constructor's upload of
    //! what the owner wrote into both regions).
    void uploadFirst(int64_t bytes, cudaStream_t stream);

    //! Returns the device allocation (null when owning nothing).
    void* device() const noexcept
    {
        return mDevice.data();
    }
    //! Returns staging region `region` (null when owning nothing).
    void* region(int32_t region) const noexcept;
    //! Returns the region of the last upload: the host copies (null when owning nothing).
    void* current() const noexcept
    {
        return region(mRegion);
    }
    //! Returns whether this object owns its buffers.
    bool owns() const noexcept
    {
        return mStaging != nullptr;
    }
    //! Returns the bytes the last upload copied.
    int64_t uploadBytes() const noexcept
    {
        return mUploadBytes;
    }

private:
    void upload(int32_t region, int64_t bytes, cudaStream_t stream);
    void release() noexcept;

    DeviceAllocation mDevice;
    //! kREGIONS regions of mBytes, one after the other.
    std::byte* mStaging{nullptr};
    int64_t mBytes{0};
    //! Recorded after each region's last upload.
    std::array<cudaEvent_t, kREGIONS> mUploaded{};
    int32_t mRegion{0};
    cudaStream_t mUploadStream{nullptr};
    int64_t mUploadBytes{0};
};

} // namespace detail

//! Device page tables for a batch of sequences of one page group, in the forms attention kernels read, at device
//! addresses that never change (so a captured CUDA graph keeps reading them):
//!  - CSR (FlashInfer's paged_kv layout): indptr [count + 1], indices [indptr[count]], lastPageLen [count];
//!  - dense block table [maxBatchSize, maxPagesPerSequence] of int32, row b holding sequence b's resident pages then
//!    kUNUSED_PAGE_ENTRY;
//!  - per sequence, firstToken (the position of the first token its table row holds: releasedPages * tokensPerPage,
//!    0 for full attention) and residentTokens (numTokens - firstToken: the tokens the row holds, the kernels'
//!    seq_lens / kv_len, equal to (rowPages - 1) * tokensPerPage + lastPageLen).
//!
//! Pages a sliding window released (leading kUNUSED_PAGE_ENTRY entries) are left out of both the CSR row and the
//! dense row, so no kernel ever reads page -1: rows start at the first resident page. How kernels use them:
//!  - FlashInfer (NHD, BatchPrefill/BatchDecodeWithPagedKVCacheWrapper): plan with paged_kv_indptr = indptr,
//!    paged_kv_indices = indices, paged_kv_last_page_len = lastPageLen, and for a window W, window_left = W - 1; the
//!    kernel sees residentTokens keys per sequence, so key j of sequence b is token firstToken[b] + j. Queries are the
//!    last tokens of the sequence; a kernel that needs absolute positions (RoPE applied in the kernel, or a
//!    position-based mask) takes firstToken as the offset to add.
//!  - A dense kernel (vLLM-style block_tables + seq_lens): block table row b with seq_lens = residentTokens, and
//!    position p of sequence b at page row[(p - firstToken[b]) / tokensPerPage], offset p % tokensPerPage.
//!  - writeTokens (kvcache/memory/kv_write.h) takes indptr, indices and firstToken as a DevicePageTable.
//!
//! The tables always describe maxBatchSize sequences, those from `count` on empty: indptr[b] = indptr[count] for
//! b > count, lastPageLen[b] = firstToken[b] = residentTokens[b] = 0 and row b all kUNUSED_PAGE_ENTRY for b >= count
//! (so a graph captured for the largest batch reads valid tables); only indices past indptr[count] are unspecified.
//! lastPageLen[b] is the tokens in the last page, in [1, tokensPerPage], or 0 for an empty sequence. Before the first
//! build() the tables are those of count 0.
//!
//! The six arrays share one device allocation, in the order indptr, lastPageLen, firstToken, residentTokens, block
//! table, indices, each starting a multiple of 128 bytes from its start; the pinned host staging has the same layout.
//! build() writes the staging and enqueues ONE cudaMemcpyAsync of its first bytes, up to the last index in use: the
//! per-sequence arrays and the whole block table (its unused rows included, which keeps them valid on the device) and
//! indices [0, indptr[count]). Copying only what is in use saves the device the unused indices (up to half the region
//! when sequences are short beside maxPagesPerSequence); one contiguous copy cannot also skip the block table's unused
//! rows without a second copy, whose fixed cost would outweigh them. On the host, a row of the block table is
//! rewritten only over its new pages and the pages it held in the previous build, so a build writes
//! O(maxBatchSize + pages in use + pages dropped), not the whole table.
//!
//! Ordering: the upload is ordered on build()'s stream. Kernels reading the tables must be ordered after it, and a
//! kernel still reading the previous tables must be ordered before it, by the caller when they run on other streams.
//! The device memory is allocated (stream-ordered) and the empty tables uploaded on the constructor's stream, which
//! must outlive the object and be ordered before work on other streams. The stream must belong to the device current
//! at construction. Not thread-safe: one thread builds at a time. Move-only.
class PageTableBuffers
{
public:
    //! Owns nothing: every pointer is null, every size 0, and build() throws InvalidArgumentError.
    PageTableBuffers() noexcept = default;
    //! Allocates pinned staging (cudaHostAlloc, two regions) and one stream-ordered device allocation
    //! (rt::DeviceAllocation) for all six arrays, laid out contiguously so one copy moves them, and uploads the tables
    //! of count 0 on `stream`.
    //! Throws InvalidArgumentError (before any CUDA call) for a non-positive size or a table of more than INT32_MAX
    //! entries (maxBatchSize * maxPagesPerSequence: indptr holds int32), OutOfMemoryError / CudaError from CUDA.
    PageTableBuffers(int32_t maxBatchSize, int32_t maxPagesPerSequence, int32_t tokensPerPage, cudaStream_t stream);
    //! Waits on the host for the last upload from each staging region, then frees the staging (cudaFreeHost) and the
    //! device memory (stream-ordered on the constructor's stream); never throws (CUDA failures are logged).
    ~PageTableBuffers() noexcept;

    PageTableBuffers(PageTableBuffers const&) = delete;
    PageTableBuffers& operator=(PageTableBuffers const&) = delete;
    //! Takes `other`'s tables (the same device addresses); `other` owns nothing afterwards.
    PageTableBuffers(PageTableBuffers&& other) noexcept;
    //! Frees this object's tables as the destructor does, then takes `other`'s (a self-move leaves it owning nothing).
    PageTableBuffers& operator=(PageTableBuffers&& other) noexcept;

    //! Builds the tables of `count` sequences and enqueues their upload on `stream`; never synchronises the device.
    //! Throws InvalidArgumentError (count outside [0, maxBatchSize], a null list with count > 0, a sequence of negative
    //! numPages or of more than maxPagesPerSequence resident pages, numTokens inconsistent with numPages, a null pages
    //! pointer with numPages > 0, a negative id after the leading kUNUSED_PAGE_ENTRY entries or a list of them alone,
    //! `stream` capturing a graph, an object that owns nothing), naming the sequence index, the field (the entry, for
    //! an id), the value and the limit; the previous tables (host and device) are then untouched and nothing is
    //! enqueued. Resident page ids are copied as given (their range is the caller's: the tables do not know the pool).
    //! Of the two staging regions, build() writes the one the last upload did not read, after waiting for the event of
    //! that region's own upload, the one before the last (a host wait only if that copy has not finished yet), so an
    //! in-flight copy is never overwritten. On a stream other than the last upload's, the upload is ordered after the
    //! last one on the device (cudaStreamWaitEvent, no host wait). Throws CudaError when CUDA fails (the host copies
    //! then still show the previous tables; the device may hold the new ones).
    void build(SequencePages const* sequences, int32_t count, cudaStream_t stream);

    //! Returns the device CSR row pointers: maxBatchSize + 1 entries, indptr[0] = 0 (null when owning nothing).
    int32_t const* deviceIndptr() const noexcept;
    //! Returns the device CSR page ids: indptr[count] in use, room for maxBatchSize * maxPagesPerSequence.
    int32_t const* deviceIndices() const noexcept;
    //! Returns the device tokens in each sequence's last page: maxBatchSize entries.
    int32_t const* deviceLastPageLen() const noexcept;
    //! Returns the device first token of each row: maxBatchSize entries (released pages * tokensPerPage).
    int32_t const* deviceFirstToken() const noexcept;
    //! Returns the device tokens each row holds, from its first token on: maxBatchSize entries (kernels' seq_lens).
    int32_t const* deviceResidentTokens() const noexcept;
    //! Returns the staging copy of deviceFirstToken() as last built (valid until the build after next).
    int32_t const* hostFirstToken() const noexcept;
    //! Returns the staging copy of deviceResidentTokens() as last built (valid until the build after next).
    int32_t const* hostResidentTokens() const noexcept;
    //! Returns the device dense block table: [maxBatchSize, maxPagesPerSequence], row-major.
    int32_t const* deviceBlockTable() const noexcept;
    //! Returns the staging copy of deviceIndptr() as last built (valid until the build after next).
    int32_t const* hostIndptr() const noexcept;
    //! Returns the staging copy of deviceIndices() as last built (valid until the build after next).
    int32_t const* hostIndices() const noexcept;
    //! Returns the staging copy of deviceLastPageLen() as last built (valid until the build after next).
    int32_t const* hostLastPageLen() const noexcept;
    //! Returns the staging copy of deviceBlockTable() as last built (valid until the build after next).
    int32_t const* hostBlockTable() const noexcept;

    //! Returns the sequences of the last build (0 before the first).
    int32_t count() const noexcept
    {
        return mCount;
    }
    //! Returns the most sequences a build takes (0 when owning nothing).
    int32_t maxBatchSize() const noexcept
    {
        return mMaxBatchSize;
    }
    //! Returns the most resident pages a sequence may hold: the block table's row length (0 when owning nothing).
    int32_t maxPagesPerSequence() const noexcept
    {
        return mMaxPagesPerSequence;
    }
    //! Returns the tokens a page holds, by which numTokens is checked and lastPageLen computed (0 when owning nothing).
    int32_t tokensPerPage() const noexcept
    {
        return mTokensPerPage;
    }
    //! Returns the bytes the last upload copied to the device (the constructor's included).
    int64_t uploadBytes() const noexcept
    {
        return mUpload.uploadBytes();
    }

private:
    int32_t* deviceArray(int64_t offset) const noexcept;
    int32_t* hostArray(int64_t offset) const noexcept;

    detail::StagedUpload mUpload;
    int32_t mMaxBatchSize{0};
    int32_t mMaxPagesPerSequence{0};
    int32_t mTokensPerPage{0};
    int32_t mCount{0};
};

} // namespace kvcache::rt
