// KVEventPackedBatch: a batch's arrays copied into one buffer with streaming stores, for the sending thread.
#include "events/kv_event_packed.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KVCACHE_STREAMING_STORES 1
#endif

namespace kvcache::rt::detail
{
namespace
{

constexpr size_t kLINE = 64;

// The buffer is read back as these types: they must be copyable as bytes and fit the 64-byte boundary that every
// array starts on.
static_assert(std::is_trivially_copyable_v<KVEvent> && std::is_trivially_copyable_v<PageHash>
    && std::is_trivially_copyable_v<KVEventPageKeys>);
static_assert(alignof(KVEvent) <= kLINE && alignof(PageHash) <= kLINE && alignof(KVEventPageKeys) <= kLINE);

size_t roundUpToLine(size_t bytes)
{
    return (bytes + kLINE - 1) / kLINE * kLINE;
}

//! Copies `bytes` bytes from `src` to `dst`, which is 64-byte aligned, and fills the rest of the last 64-byte line
//! with zeros. With streaming stores every line is written whole, so none is read back from memory to be merged.
void copyStreaming(uint8_t* dst, void const* src, size_t bytes) noexcept
{
    auto const* from = static_cast<uint8_t const*>(src);
#ifdef KVCACHE_STREAMING_STORES
    size_t done = 0;
    for (; done + 16 <= bytes; done += 16)
    {
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done),
            _mm_loadu_si128(reinterpret_cast<__m128i const*>(from + done)));
    }
    if (done < bytes)
    {
        alignas(16) uint8_t last[16] = {};
        std::memcpy(last, from + done, bytes - done);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done), _mm_load_si128(reinterpret_cast<__m128i const*>(last)));
        done += 16;
    }
    for (; done % kLINE != 0; done += 16)
    {
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done), _mm_setzero_si128());
    }
#else
    if (bytes > 0)
    {
        std::memcpy(dst, from, bytes);
    }
#endif
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

void KVEventPackedBatch::LineAlignedDelete::operator()(uint8_t* bytes) const noexcept
{
    ::operator delete[](bytes, std::align_val_t{kLINE});
}

KVEventPackedBatch::KVEventPackedBatch(KVEventPackedBatch&& other) noexcept
{
    *this = std::move(other);
}

KVEventPackedBatch& KVEventPackedBatch::operator=(KVEventPackedBatch&& other) noexcept
{
    if (this != &other)
    {
        mBytes = std::move(other.mBytes);
        mCapacity = std::exchange(other.mCapacity, 0);
        for (size_t i = 0; i < kARRAYS; ++i)
        {
            mCounts[i] = std::exchange(other.mCounts[i], 0);
            mOffsets[i] = std::exchange(other.mOffsets[i], 0);
        }
    }
    return *this;
}

void KVEventPackedBatch::pack(KVEventBatch const& batch)
{
    void const* const sources[kARRAYS] = {batch.events().data(), batch.hashes().data(), batch.tokens().data(),
        batch.pageKeys().data(), batch.keyBytes().data()};
    size_t const counts[kARRAYS] = {batch.events().size(), batch.hashes().size(), batch.tokens().size(),
        batch.pageKeys().size(), batch.keyBytes().size()};
    size_t const sizes[kARRAYS] = {sizeof(KVEvent), sizeof(PageHash), sizeof(int32_t), sizeof(KVEventPageKeys), 1};
    size_t offsets[kARRAYS] = {};
    size_t total = 0;
    for (size_t i = 0; i < kARRAYS; ++i)
    {
        offsets[i] = total;
        total += roundUpToLine(counts[i] * sizes[i]);
    }
    if (total > mCapacity)
    {
        // Grown at least twofold, so that a stream of batches growing slowly reallocates rarely.
        size_t const capacity = std::max(total, 2 * mCapacity);
        mBytes.reset(static_cast<uint8_t*>(::operator new[](capacity, std::align_val_t{kLINE})));
        mCapacity = capacity;
    }
    for (size_t i = 0; i < kARRAYS; ++i)
    {
        copyStreaming(mBytes.get() + offsets[i], sources[i], counts[i] * sizes[i]);
        mCounts[i] = counts[i];
        mOffsets[i] = offsets[i];
    }
}

KVEventArrays KVEventPackedBatch::arrays() const noexcept
{
    uint8_t const* const base = mBytes.get();
    KVEventArrays arrays;
    if (base == nullptr)
    {
        return arrays;
    }
    arrays.events = reinterpret_cast<KVEvent const*>(base + mOffsets[0]);
    arrays.numEvents = mCounts[0];
    arrays.hashes = reinterpret_cast<PageHash const*>(base + mOffsets[1]);
    arrays.tokens = reinterpret_cast<int32_t const*>(base + mOffsets[2]);
    arrays.pageKeys = reinterpret_cast<KVEventPageKeys const*>(base + mOffsets[3]);
    arrays.keyBytes = base + mOffsets[4];
    return arrays;
}

void streamingStoresDone() noexcept
{
#ifdef KVCACHE_STREAMING_STORES
    _mm_sfence();
#endif
}

} // namespace kvcache::rt::detail
