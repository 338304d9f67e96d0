// KVEventRing: batches copied whole into one ring of bytes, for the publisher's sending thread.
#include "events/kv_event_packed.h"

#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

namespace kvcache::rt::detail
{
namespace
{

constexpr size_t kLINE = 64;
//! The arrays of a record: events, hashes, tokens, page keys and key bytes.
constexpr size_t kARRAYS = 5;
constexpr size_t kELEMENT_BYTES[kARRAYS] = {
    sizeof(KVEvent), sizeof(PageHash), sizeof(int32_t), sizeof(KVEventPageKeys), 1};

// A record's arrays are read back as these types: they must be copyable as bytes and fit the 64-byte boundary that
// every array starts on.
static_assert(std::is_trivially_copyable_v<KVEvent> && std::is_trivially_copyable_v<PageHash>
    && std::is_trivially_copyable_v<KVEventPageKeys>);
static_assert(alignof(KVEvent) <= kLINE && alignof(PageHash) <= kLINE && alignof(KVEventPageKeys) <= kLINE);

//! The first 64 bytes of a record. `bytes` 0 marks the end of the ring's used part: the next record is at its start.
struct alignas(kLINE) RecordHeader
{
    uint64_t bytes;
    int64_t sequence;
    double timestamp;
    uint64_t counts[kARRAYS];
};
static_assert(sizeof(RecordHeader) == kLINE);

size_t roundUpToLine(size_t bytes)
{
    return (bytes + kLINE - 1) / kLINE * kLINE;
}

//! Sets where each array of a record of `counts` elements starts (from the record's start) and returns the record's
//! bytes.
size_t layOut(uint64_t const (&counts)[kARRAYS], size_t (&offsets)[kARRAYS])
{
    size_t total = sizeof(RecordHeader);
    for (size_t i = 0; i < kARRAYS; ++i)
    {
        offsets[i] = total;
        total += roundUpToLine(static_cast<size_t>(counts[i]) * kELEMENT_BYTES[i]);
    }
    return total;
}

} // namespace

KVEventArrays arraysOf(KVEventBatch const& batch) noexcept
{
    KVEventArrays arrays;
    arrays.events = batch.events().data();
    arrays.numEvents = batch.events().size();
    arrays.hashes = batch.hashes().data();
    arrays.tokens = batch.tokens().data();
    arrays.pageKeys = batch.pageKeys().data();
    arrays.keyBytes = batch.keyBytes().data();
    return arrays;
}

void KVEventRing::LineAlignedDelete::operator()(uint8_t* bytes) const noexcept
{
    ::operator delete[](bytes, std::align_val_t{kLINE});
}

KVEventRing::KVEventRing(size_t bytes)
    : mBytes(static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{kLINE})))
    , mCapacity(bytes)
{
    std::memset(mBytes.get(), 0, bytes);
}

bool KVEventRing::push(KVEventBatch const& batch, int64_t sequence, double timestamp) noexcept
{
    void const* const sources[kARRAYS] = {batch.events().data(), batch.hashes().data(), batch.tokens().data(),
        batch.pageKeys().data(), batch.keyBytes().data()};
    uint64_t const counts[kARRAYS] = {batch.events().size(), batch.hashes().size(), batch.tokens().size(),
        batch.pageKeys().size(), batch.keyBytes().size()};
    size_t offsets[kARRAYS] = {};
    size_t const bytes = layOut(counts, offsets);
    uint64_t const written = mWritten.load(std::memory_order_relaxed);
    size_t const at = static_cast<size_t>(written % mCapacity);
    // A record that does not fit before the ring's end goes to its start, and the bytes left at the end are skipped.
    size_t const skipped = at + bytes > mCapacity ? mCapacity - at : 0;
    uint64_t const end = written + skipped + bytes;
    if (end - mFinishedSeen > mCapacity)
    {
        mFinishedSeen = mFinished.load(std::memory_order_acquire);
        if (end - mFinishedSeen > mCapacity)
        {
            return false;
        }
    }
    if (skipped > 0)
    {
        reinterpret_cast<RecordHeader*>(mBytes.get() + at)->bytes = 0;
    }
    uint8_t* const record = mBytes.get() + (at + skipped) % mCapacity;
    auto* const header = reinterpret_cast<RecordHeader*>(record);
    header->bytes = bytes;
    header->sequence = sequence;
    header->timestamp = timestamp;
    for (size_t i = 0; i < kARRAYS; ++i)
    {
        header->counts[i] = counts[i];
        if (counts[i] > 0)
        {
            std::memcpy(record + offsets[i], sources[i], static_cast<size_t>(counts[i]) * kELEMENT_BYTES[i]);
        }
    }
    // Sequentially consistent, so that the publisher's look at whether the reader sleeps cannot pass it.
    mWritten.store(end, std::memory_order_seq_cst);
    return true;
}

bool KVEventRing::halfFull() noexcept
{
    uint64_t const written = mWritten.load(std::memory_order_relaxed);
    if (2 * (written - mFinishedSeen) < mCapacity)
    {
        return false;
    }
    mFinishedSeen = mFinished.load(std::memory_order_acquire);
    return 2 * (written - mFinishedSeen) >= mCapacity;
}

bool KVEventRing::front(KVEventRecord& record) noexcept
{
    uint64_t const finished = mFinished.load(std::memory_order_relaxed);
    if (mWritten.load(std::memory_order_acquire) == finished)
    {
        return false;
    }
    size_t const at = static_cast<size_t>(finished % mCapacity);
    auto const* header = reinterpret_cast<RecordHeader const*>(mBytes.get() + at);
    size_t skipped = 0;
    if (header->bytes == 0)
    {
        skipped = mCapacity - at;
        header = reinterpret_cast<RecordHeader const*>(mBytes.get());
    }
    mFrontBytes = skipped + header->bytes;
    size_t offsets[kARRAYS] = {};
    layOut(header->counts, offsets);
    auto const* base = reinterpret_cast<uint8_t const*>(header);
    record.sequence = header->sequence;
    record.timestamp = header->timestamp;
    record.arrays.events = reinterpret_cast<KVEvent const*>(base + offsets[0]);
    record.arrays.numEvents = static_cast<size_t>(header->counts[0]);
    record.arrays.hashes = reinterpret_cast<PageHash const*>(base + offsets[1]);
    record.arrays.tokens = reinterpret_cast<int32_t const*>(base + offsets[2]);
    record.arrays.pageKeys = reinterpret_cast<KVEventPageKeys const*>(base + offsets[3]);
    record.arrays.keyBytes = base + offsets[4];
    return true;
}

void KVEventRing::pop() noexcept
{
    mFinished.store(mFinished.load(std::memory_order_relaxed) + mFrontBytes, std::memory_order_seq_cst);
}

} // namespace kvcache::rt::detail
