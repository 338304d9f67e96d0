#pragma once

#include "kvcache/memory/kv_write.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/paging/page_table.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace kvcache::rt
{

namespace detail
{
struct StepArgumentShape;
struct StepScratch;
} // namespace detail

//! Everything the write and the attention kernels of every page group take for one step, built from the step's
//! (sequence, tokens) entries in one call and uploaded in one copy, at device addresses that never change (so a
//! captured CUDA graph keeps reading them):
//!  - token positions for writeTokens: maxTokensPerStep TokenPosition rows, row i of the step's tokens being
//!    {entry index, absolute position}, entries in order and each entry's tokens in order (the last `count` positions
//!    of its sequence, as PageManager::step() appended them); rows from tokenCount() on are {-1, 0}, which writeTokens
//!    skips, so a write sized for maxTokensPerStep is valid;
//!  - qoIndptr [maxBatchSize + 1]: qoIndptr[b] is the first token row of entry b (FlashInfer's qo_indptr), entries
//!    from `count` on empty (qoIndptr[b] = tokenCount() for b > count);
//!  - tokenCount: one device int32, the step's tokens, for TokenOpOptions::deviceCount;
//!  - stateSlots [maxBatchSize]: row b is the state slot of entry b's sequence (PageManager::stateSlot, "State
//!    slots" in PageManager's comment; vLLM's state_indices), where batched recurrent kernels find its state; rows
//!    from `count` on are -1, padding a kernel skips. A layout without state layers keeps the array, -1 in every row
//!    (as PageManager::stateSlots writes then), so kernels and captured graphs read one address either way;
//!  - per page group, the tables PageTableBuffers describes (CSR indptr, indices, lastPageLen, firstToken,
//!    residentTokens and the dense block table), row b for entry b's sequence, each group at its own width: the
//!    group's pagesPerSequence (a windowed group counts only the pages its window holds).
//!
//! An entry of 0 tokens still gets its table rows (its sequence's pages, for a kernel that reads them) and no query
//! tokens: qoIndptr[b + 1] = qoIndptr[b]. A sequence listed twice gets two rows (of one state slot).
//!
//! Layout: one device allocation holds the token count, qoIndptr, the state slots, the positions, then each group's
//! tables in the layout of PageTableBuffers, group by group, each array starting a multiple of 128 bytes from the
//! start; the pinned staging has the same layout, two regions used in turn as PageTableBuffers uses them. build()
//! enqueues ONE cudaMemcpyAsync of the staging's first bytes, up to the last group's last index in use (the earlier
//! groups' unused index room travels too). The tables are rewritten on the host only where they differ from that
//! region's previous build, as PageTableBuffers does; position rows past the token count are reset only where that
//! build used them; qoIndptr and the state slots (maxBatchSize entries each) are written whole.
//!
//! Ordering, streams and threads as PageTableBuffers: the upload is ordered on build()'s stream; kernels reading the
//! buffers must be ordered after it, and those still reading the previous ones before it. The constructor's stream
//! must outlive the object. Not thread-safe. Move-only.
class StepArgumentBuffers
{
public:
    //! Owns nothing: build() throws InvalidArgumentError.
    StepArgumentBuffers() noexcept;
    //! Sizes the buffers for `manager`'s page groups (each group's pagesPerSequence, the layout's tokensPerPage),
    //! `maxBatchSize` entries and `maxTokensPerStep` tokens a step; allocates them as PageTableBuffers does and
    //! uploads the arguments of an empty step on `stream`. Throws InvalidArgumentError (before any CUDA call) for a
    //! non-positive size or a group table of more than INT32_MAX entries, OutOfMemoryError / CudaError from CUDA.
    StepArgumentBuffers(
        PageManager const& manager, int32_t maxBatchSize, int32_t maxTokensPerStep, cudaStream_t stream);
    //! Waits for the uploads in flight, then frees everything; never throws.
    ~StepArgumentBuffers() noexcept;
    StepArgumentBuffers(StepArgumentBuffers const&) = delete;
    StepArgumentBuffers& operator=(StepArgumentBuffers const&) = delete;
    //! Takes `other`'s buffers (the same device addresses); `other` owns nothing afterwards.
    StepArgumentBuffers(StepArgumentBuffers&& other) noexcept;
    StepArgumentBuffers& operator=(StepArgumentBuffers&& other) noexcept;

    //! Builds the arguments of the step whose entries are entries[0, count), called after manager.step(entries, count)
    //! (or with the same (sequence, count) pairs: only those two fields are read), and enqueues their upload on
    //! `stream`; never synchronises the device. Throws InvalidArgumentError, naming the field, the value and the limit,
    //! for: an object that owns nothing, a manager whose groups differ from the constructor's, `stream` capturing a
    //! graph, count outside [0, maxBatchSize], null entries with count > 0, an entry whose sequence the manager does
    //! not hold, an entry count outside [0, the sequence's length], counts adding up past maxTokensPerStep; nothing is
    //! then enqueued and the host and device copies are those of the previous build. Throws CudaError when CUDA fails.
    void build(PageManager const& manager, SequenceAppend const* entries, int32_t count, cudaStream_t stream);

    //! Returns the device token positions: maxTokensPerStep rows, tokenCount() in use (null when owning nothing).
    TokenPosition const* devicePositions() const noexcept;
    //! Returns the device qo_indptr: maxBatchSize + 1 entries.
    int32_t const* deviceQoIndptr() const noexcept;
    //! Returns the device token count: one int32, for TokenOpOptions::deviceCount.
    int32_t const* deviceTokenCount() const noexcept;
    //! Returns the device state slots: maxBatchSize entries, -1 from count() on (and everywhere without state layers).
    int32_t const* deviceStateSlots() const noexcept;
    //! Returns the staging copy of devicePositions() as last built (valid until the build after next).
    TokenPosition const* hostPositions() const noexcept;
    //! Returns the staging copy of deviceQoIndptr() as last built (valid until the build after next).
    int32_t const* hostQoIndptr() const noexcept;
    //! Returns the staging copy of deviceStateSlots() as last built (valid until the build after next).
    int32_t const* hostStateSlots() const noexcept;

    //! Returns group `group`'s CSR page table for writeTokens: its indptr, indices and firstToken, maxBatchSize rows.
    //! Throws OutOfRangeError for a group outside [0, numGroups()).
    DevicePageTable table(int32_t group) const;
    //! Return group `group`'s device arrays, as PageTableBuffers' accessors of the same names describe them (a block
    //! table [maxBatchSize, maxPagesPerSequence(group)]). Throw OutOfRangeError for a bad group.
    int32_t const* deviceIndptr(int32_t group) const;
    int32_t const* deviceIndices(int32_t group) const;
    int32_t const* deviceLastPageLen(int32_t group) const;
    int32_t const* deviceFirstToken(int32_t group) const;
    int32_t const* deviceResidentTokens(int32_t group) const;
    int32_t const* deviceBlockTable(int32_t group) const;
    //! Return the staging copies of the arrays above as last built (valid until the build after next).
    int32_t const* hostIndptr(int32_t group) const;
    int32_t const* hostIndices(int32_t group) const;
    int32_t const* hostLastPageLen(int32_t group) const;
    int32_t const* hostFirstToken(int32_t group) const;
    int32_t const* hostResidentTokens(int32_t group) const;
    int32_t const* hostBlockTable(int32_t group) const;
    //! Returns the page ids group `group`'s indices hold in the last build: hostIndptr(group)[count()].
    int32_t usedIndices(int32_t group) const;
    //! Returns the row length of group `group`'s block table: the group's pagesPerSequence.
    int32_t maxPagesPerSequence(int32_t group) const;

    //! Returns the entries of the last build (0 before the first).
    int32_t count() const noexcept
    {
        return mCount;
    }
    //! Returns the tokens of the last build: the positions in use (0 before the first).
    int32_t tokenCount() const noexcept
    {
        return mTokenCount;
    }
    //! Returns the number of page groups (0 when owning nothing).
    int32_t numGroups() const noexcept;
    //! Returns the most entries a build takes (0 when owning nothing).
    int32_t maxBatchSize() const noexcept;
    //! Returns the most tokens a build takes: the positions' rows (0 when owning nothing).
    int32_t maxTokensPerStep() const noexcept;
    //! Returns the tokens a page holds (0 when owning nothing).
    int32_t tokensPerPage() const noexcept;
    //! Returns the bytes the last upload copied to the device (the constructor's included).
    int64_t uploadBytes() const noexcept
    {
        return mUpload.uploadBytes();
    }

private:
    int32_t const* deviceArray(int64_t offset) const noexcept;
    int32_t const* hostArray(int64_t offset) const noexcept;
    //! Returns the offset of group `group`'s tables; throws OutOfRangeError for a bad group.
    int64_t groupOffset(int32_t group) const;

    std::unique_ptr<detail::StepArgumentShape const> mShape;
    detail::StagedUpload mUpload;
    //! Reused between builds, so that a steady batch allocates nothing.
    std::unique_ptr<detail::StepScratch> mScratch;
    int32_t mCount{0};
    int32_t mTokenCount{0};
};

} // namespace kvcache::rt
