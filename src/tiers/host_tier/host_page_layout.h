#pragma once

// Where a page's bytes sit in a host page (docs/layout.md, "Host pages"): host only, no CUDA, shared by the host tier's
// kernel parameters and the host tests.

#include "kvcache/core/kv_cache_layout.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! A host page of one page group: the group's layer-table entries in table order (layerTableEntries), each entry's K
//! page then its V page (none for a latent layer), contiguous. So a host page holds the data of every layer of the
//! group, K then V, in layer order, then, with scale pools, the scales of every layer in the same order, K scales
//! then V scales; nothing between them.
struct HostPageLayout
{
    //! Bytes from a host page's start to each table entry's K page: the group's data entries, then (with scale pools)
    //! its scale entries, as the device table lists them. An entry's V page follows its K page.
    std::vector<int64_t> entryOffsets = {};
    //! The largest page of one half among the entries, data or scales: what the kernel's work items of a half cover.
    int64_t largestPageBytes = 0;
    //! Bytes of one host page: the group's bytesPerPage, data and scales.
    int64_t hostPageBytes = 0;
    //! Pages of one half a host page holds (each entry's K page, and its V page where it has one): the copy engine's
    //! descriptors for one host page moved straight.
    int64_t pageHalves = 0;
};

//! Returns the host page layout of page group `group` of `layout` (computed in int64; computeLayout has bounded every
//! size). Throws OutOfRangeError for a group outside [0, layout.groups.size()).
HostPageLayout hostPageLayout(KVCacheLayout const& layout, int32_t group);

} // namespace kvcache::rt::detail
