// A KV event batch copied into one buffer for the publisher's sending thread, and the arrays the encoder reads.
#pragma once

#include "kvcache/events/kv_event_publisher.h"

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

//! A copy of a batch's arrays in one buffer, each from a 64-byte boundary, kept when the next batch is copied in. On
//! x86-64 the copy uses stores that bypass the caches: another core reads the buffer next, and ordinary stores would
//! have to take each line back from that core's cache when the buffer is filled again, stalling the thread that
//! fills it. Call streamingStoresDone() before handing the buffer to another thread.
class KVEventPackedBatch
{
public:
    KVEventPackedBatch() = default;
    //! A moved-from batch holds no buffer.
    KVEventPackedBatch(KVEventPackedBatch&& other) noexcept;
    KVEventPackedBatch& operator=(KVEventPackedBatch&& other) noexcept;

    //! Copies `batch` in, growing the buffer when it is too small; throws std::bad_alloc (the buffer as it was).
    void pack(KVEventBatch const& batch);
    //! The arrays of the batch copied in last; never throws.
    KVEventArrays arrays() const noexcept;
    bool hasBuffer() const noexcept
    {
        return mBytes != nullptr;
    }

private:
    //! Bytes of the five arrays (events, hashes, tokens, page keys, key bytes), each rounded up to 64.
    static constexpr size_t kARRAYS = 5;
    //! Frees a buffer allocated on a 64-byte boundary.
    struct LineAlignedDelete
    {
        void operator()(uint8_t* bytes) const noexcept;
    };
    std::unique_ptr<uint8_t[], LineAlignedDelete> mBytes;
    size_t mCapacity = 0;
    size_t mCounts[kARRAYS] = {};
    size_t mOffsets[kARRAYS] = {};
};

//! Orders the streaming stores made so far before this thread's later stores (x86-64's sfence); never throws.
void streamingStoresDone() noexcept;

} // namespace kvcache::rt::detail
