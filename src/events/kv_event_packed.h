// KV event batches queued for the publisher's sending thread in one ring of bytes, and the arrays the encoder reads.
#pragma once

#include "kvcache/events/kv_event_publisher.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace kvcache::rt::detail
{

//! The arrays of a batch as the encoder reads them, wherever they are kept (KVEventBatch's accessors say what each
//! holds). pageKeys may be shorter than hashes: only hashes of events with hasKeys are looked up.
struct KVEventArrays
{
    KVEvent const* events = nullptr;
    size_t numEvents = 0;
    PageHash const* hashes = nullptr;
    int32_t const* tokens = nullptr;
    KVEventPageKeys const* pageKeys = nullptr;
    uint8_t const* keyBytes = nullptr;
};

//! The arrays of `batch`; never throws.
KVEventArrays arraysOf(KVEventBatch const& batch) noexcept;

//! encodeKVEventBatch() of the batch whose arrays these are.
void encodeKVEventArrays(KVEventArrays const& arrays, double timestamp, KVEventEncoding encoding,
    std::optional<int32_t> dataParallelRank, std::vector<uint8_t>& out);

//! One batch in a KVEventRing, as the reading thread sees it.
struct KVEventRecord
{
    int64_t sequence = -1;
    double timestamp = 0;
    KVEventArrays arrays;
};

//! Batches queued from one thread (the writer) to another (the reader) in one ring of bytes allocated once: each batch
//! is copied whole into a record (a 64-byte header, then the batch's arrays, each from a 64-byte boundary) after the
//! records before it, wrapping to the ring's start when it does not fit before the end. The writer alone advances the
//! count of bytes written, the reader alone the count it has finished with, so neither takes a lock or waits.
//!
//! The writer reads nothing the reader writes, except the reader's count when the ring looks too full for the next
//! record.
class KVEventRing
{
public:
    //! Allocates `bytes` (a multiple of 64) and writes every page of it once, so that no later copy takes a page
    //! fault; throws std::bad_alloc.
    explicit KVEventRing(size_t bytes);

    size_t capacity() const noexcept
    {
        return mCapacity;
    }

    //! Writer: copies `batch` in as the next record and makes it visible to the reader; returns false, copying
    //! nothing, when the ring has no room for it (a record larger than the ring never has). Never throws.
    bool push(KVEventBatch const& batch, int64_t sequence, double timestamp) noexcept;
    //! Writer: the bytes written so far (records and the gaps left at the ring's end).
    uint64_t written() const noexcept
    {
        return mWritten.load(std::memory_order_relaxed);
    }
    //! Writer: whether the records not yet finished take half the ring or more, looking at the reader's count only
    //! when the writer's last look says so.
    bool halfFull() noexcept;

    //! Reader: whether a record is waiting (sequentially consistent, for the sending thread's look before it sleeps).
    bool waiting() const noexcept
    {
        return mWritten.load(std::memory_order_seq_cst) != mFinished.load(std::memory_order_relaxed);
    }
    //! Reader: the oldest record not finished with, when there is one.
    bool front(KVEventRecord& record) noexcept;
    //! Reader: finishes with the record front() returned last.
    void pop() noexcept;
    //! Any thread: the bytes the reader has finished with.
    uint64_t finished() const noexcept
    {
        return mFinished.load(std::memory_order_seq_cst);
    }

private:
    //! Frees a buffer allocated on a 64-byte boundary.
    struct LineAlignedDelete
    {
        void operator()(uint8_t* bytes) const noexcept;
    };

    std::unique_ptr<uint8_t[], LineAlignedDelete> mBytes;
    size_t mCapacity = 0;
    //! Written by the writer only: bytes written; and its last look at mFinished.
    alignas(64) std::atomic<uint64_t> mWritten{0};
    uint64_t mFinishedSeen = 0;
    //! Written by the reader only: bytes finished with; and the size of the record front() returned last.
    alignas(64) std::atomic<uint64_t> mFinished{0};
    uint64_t mFrontBytes = 0;
};

} // namespace kvcache::rt::detail
