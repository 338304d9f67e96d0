#pragma once

// What one page id of a page group holds and in what order (docs/layout.md, "Host pages"), what one state slot holds
// and in what order, and the rule that finds a page half in the cache. The layer table the kernels read, host pages,
// page transfers and sequence files all derive from this one description, so none of them writes the order out again.
// Host only, except LayerTableEntry, which device code reads.

#include "kvcache/core/host_device.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! Which of a layer's two allocations a part of a page lives in.
enum class PagePartKind : int32_t
{
    kDATA = 0,   //!< the layer's values: its data pool
    kSCALES = 1, //!< the layer's page scales: its scale pool (kFP8_PER_TOKEN_HEAD, kNVFP4)
};

//! One layer's share of a page in one of its allocations: its K half, then its V half where it has one.
struct PageEntry
{
    int32_t layer = 0; //!< index into the group's layers (PageGeometry::layers, KVPageGroupLayout::layers)
    PagePartKind kind = PagePartKind::kDATA;
    int32_t halves = 0;    //!< 2 (K and V), or 1 for a latent layer
    int64_t halfBytes = 0; //!< bytes of one half of one page
    int64_t offset = 0;    //!< bytes from the start of a packed page to this entry's K half
};

//! What one page of a group holds: every layer's data entry in layer order, then, for a quantization with page scales,
//! every layer's scale entry in the same order. A packed page (a host page, a sequence file's page record, a page
//! transfer's staging) holds the entries' halves back to back in this order, each entry's K half then its V half.
//! A new kind of page part is one more run of entries here.
struct PageAnatomy
{
    std::vector<PageEntry> entries = {};
    int64_t bytesPerPage = 0;     //!< every entry's halves: the group's bytesPerPage
    int64_t halves = 0;           //!< page halves of every entry
    int64_t largestHalfBytes = 0; //!< the largest halfBytes of the entries
};

//! Returns the anatomy of a page of `geometry` (its bytesPerPage is not read). Throws InvalidArgumentError naming the
//! layer, the sizes and the limit when a page's bytes leave int64 (a geometry read from a file can ask for that).
PageAnatomy pageAnatomy(PageGeometry const& geometry);

//! Returns the anatomy of a page of group `group` of `layout`; throws OutOfRangeError for a group outside
//! [0, layout.groups.size()).
PageAnatomy pageAnatomy(KVCacheLayout const& layout, int32_t group);

//! One state tensor's share of a state slot (kvcache/core/kv_cache_layout.h, StateTensorLayout).
struct StateSlotEntry
{
    int32_t stateLayer = 0;  //!< index into KVCacheLayout::stateLayers
    int32_t tensor = 0;      //!< index into the layer's tensors
    int64_t bytes = 0;       //!< the tensor's slotBytes
    int64_t layerOffset = 0; //!< the tensor's offsetBytes: where it starts in its layer's allocation
    int64_t offset = 0;      //!< bytes from the start of a packed state slot to this entry
};

//! What one state slot holds: every state layer in layout order, each layer's tensors in config order. A packed state
//! slot (a host tier's host state, a sequence file's state record) holds the entries back to back in this order, with
//! no padding. Slot n of an entry starts layerOffset + n * bytes after its layer's allocation.
struct StateSlotAnatomy
{
    std::vector<StateSlotEntry> entries = {};
    int64_t bytesPerSlot = 0; //!< every entry's bytes: KVCacheLayout::stateBytesPerSlot
};

//! Returns the anatomy of a state slot of `layout` (no entries and 0 bytes without state layers).
StateSlotAnatomy stateSlotAnatomy(KVCacheLayout const& layout);

//! Returns the layout's index of the layer `entry` describes in group `group`.
inline int32_t layoutLayer(KVCacheLayout const& layout, int32_t group, PageEntry const& entry)
{
    return layout.groups[static_cast<size_t>(group)].layers[static_cast<size_t>(entry.layer)];
}

//! One page entry as the kernels read it: where its pool starts and how large one page of one half is. The V pool
//! (when the layer has one) starts numPages * halfBytes after kBase, numPages being the group's. 16 bytes, 16-aligned:
//! a kernel fetches an entry with one load, so whether V exists is folded into the page size.
struct alignas(16) LayerTableEntry
{
    char* kBase;           //!< start of the K pool
    int64_t pageBytesAndV; //!< (bytes of one page of one half) * 2, plus 1 when the layer has a V half

    //! Bytes of one page of one half.
    KVCACHE_HOST_DEVICE int64_t pageBytes() const
    {
        return pageBytesAndV >> 1;
    }
    //! True when the entry has a V half.
    KVCACHE_HOST_DEVICE bool hasV() const
    {
        return (pageBytesAndV & 1) != 0;
    }
    //! Returns the first byte of page `page`'s half `half` (0: K, 1: V) in a group of `numPages` pages per half.
    KVCACHE_HOST_DEVICE char* halfAddress(int32_t half, int64_t numPages, int64_t page) const
    {
        return kBase + (int64_t{half} * numPages + page) * pageBytes();
    }
};
static_assert(sizeof(LayerTableEntry) == 16, "KVCacheManager::allocatedBytes documents 16 bytes per layer");

//! Returns the table entry of `entry` whose pool starts at `base`.
inline LayerTableEntry makeLayerTableEntry(char* base, PageEntry const& entry)
{
    return LayerTableEntry{base, entry.halfBytes * 2 + (entry.halves == 2 ? 1 : 0)};
}

} // namespace kvcache::rt::detail
