#pragma once

#include "kvcache/paging/page_hash.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! Where the pages of a KV event are kept: vLLM's `medium` strings "GPU", "CPU" and "DISK".
enum class KVEventMedium : int32_t
{
    kGPU = 0,  //!< a PageManager's device pages
    kCPU = 1,  //!< a TieredPrefixCache's host pages
    kDISK = 2, //!< a TieredPrefixCache's disk pages
};

//! Returns "GPU", "CPU" or "DISK", or "unknown" for a value outside the enumeration; never throws.
char const* toString(KVEventMedium medium) noexcept;

//! What a KV event says, as vLLM's BlockStored, BlockRemoved and AllBlocksCleared do.
enum class KVEventType : int32_t
{
    //! Pages of one sequence, in token order, now kept under their hashes (a run: each page's parent is the page
    //! before it; the first one's is `parent`, absent for a sequence's first page).
    kSTORED = 0,
    //! Pages no longer kept under these hashes.
    kREMOVED = 1,
    //! Every page of every medium forgotten.
    kALL_CLEARED = 2,
};

//! The extra keys of one page of a stored event: KVEventBatch::keyBytes()[offset, offset + saltBytes + 20 * numKeys)
//! holds the sequence's salt (its first page only) and then each extra key of the page as the page hash mixes it in
//! (the key's offset in the page as int32, key.lo and key.hi as uint64, little-endian; PageManager's class comment).
struct KVEventPageKeys
{
    int64_t offset = 0;
    int32_t saltBytes = 0;
    int32_t numKeys = 0;
};

//! One event of a KVEventBatch. Its pages' hashes are KVEventBatch::hashes()[firstHash, firstHash + numHashes); a
//! stored event's token ids are tokens()[firstToken, firstToken + numTokens) (tokensPerPage a page, or none for the
//! host and disk media, which never see token ids: a router knows them from the device event of the same hash), and
//! when hasKeys, pageKeys()[firstHash, firstHash + numHashes) are its pages' extra keys.
struct KVEvent
{
    KVEventType type = KVEventType::kSTORED;
    KVEventMedium medium = KVEventMedium::kGPU;
    //! The page group (vLLM's group_idx); 0 for kALL_CLEARED.
    int32_t group = 0;
    //! Tokens per page (vLLM's block_size); stored events only.
    int32_t tokensPerPage = 0;
    bool hasParent = false;
    bool hasKeys = false;
    PageHash parent = {};
    int64_t firstHash = 0;
    int64_t numHashes = 0;
    int64_t firstToken = 0;
    int64_t numTokens = 0;
};

//! The KV events recorded since the last hand-over, in the order they happened, in flat buffers that are reused: a
//! batch's vectors keep their capacity when cleared, so a runtime that hands the same batch to takeEvents() after
//! each step makes the recorder's buffers and its own trade places, and neither allocates once both have grown to
//! the largest batch. Consecutive removals of one group and medium are merged into one event.
class KVEventBatch
{
public:
    KVEventBatch() = default;

    //! Returns the events, in order.
    std::vector<KVEvent> const& events() const noexcept
    {
        return mEvents;
    }
    std::vector<PageHash> const& hashes() const noexcept
    {
        return mHashes;
    }
    std::vector<int32_t> const& tokens() const noexcept
    {
        return mTokens;
    }
    //! The extra keys of the hashes of stored events with hasKeys: pageKeys()[h] for each such hash h. Hashes of
    //! other events may have no entry (the vector may be shorter than hashes()) or one of no keys.
    std::vector<KVEventPageKeys> const& pageKeys() const noexcept
    {
        return mPageKeys;
    }
    std::vector<uint8_t> const& keyBytes() const noexcept
    {
        return mKeyBytes;
    }
    bool empty() const noexcept
    {
        return mEvents.empty();
    }

    //! Forgets every event, keeping the buffers' capacity; never throws.
    void clear() noexcept;
    //! Reserves room for `events` events, `hashes` hashes and `tokens` token ids; throws std::bad_alloc.
    void reserve(size_t events, size_t hashes, size_t tokens);
    //! Makes room for `events` more events, `hashes` more hashes, `tokens` more token ids and `keyBytes` more key
    //! bytes (growing a buffer at least twofold when it grows), so that recording them allocates nothing; throws
    //! std::bad_alloc.
    void reserveMore(size_t events, size_t hashes, size_t tokens, size_t keyBytes);
    //! Swaps contents and buffers with `other`; never throws.
    void swap(KVEventBatch& other) noexcept;
    //! Appends every event of `other` after this batch's own (its hashes, tokens and keys copied).
    void append(KVEventBatch const& other);

    //! Records an AllBlocksCleared event.
    void addAllCleared();
    //! Records the removal of `hash` from `group` of `medium`, merged into the last event when that is a removal of
    //! the same group and medium.
    void addRemoved(int32_t group, KVEventMedium medium, PageHash const& hash);
    //! Starts a stored event of `group`, `medium` and `tokensPerPage` whose first page's parent is `parent` (null for
    //! none); pages are added with addStoredPage().
    void beginStored(int32_t group, KVEventMedium medium, int32_t tokensPerPage, PageHash const* parent);
    //! Adds a page to the stored event begun last: its hash, its tokens (tokensPerPage of them, or null for none), and
    //! its extra key bytes (salt then keys, as KVEventPageKeys says; saltBytes + 20 * numKeys bytes, null when both
    //! are 0).
    void addStoredPage(
        PageHash const& hash, int32_t const* tokens, uint8_t const* keys, int32_t saltBytes, int32_t numKeys);

private:
    //! Gives every hash before `count` an entry in mPageKeys (of no keys) that has none.
    void padPageKeys(size_t count);
    //! Appends an event of `type`, `medium` and `group` that starts at the current ends of the hashes and tokens.
    KVEvent& addEvent(KVEventType type, KVEventMedium medium, int32_t group);
    void addHash(PageHash const& hash);

    std::vector<KVEvent> mEvents;
    std::vector<PageHash> mHashes;
    std::vector<int32_t> mTokens;
    std::vector<KVEventPageKeys> mPageKeys;
    std::vector<uint8_t> mKeyBytes;
};

} // namespace kvcache::rt
