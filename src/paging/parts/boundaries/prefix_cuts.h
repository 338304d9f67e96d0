#pragma once

#include "paging/parts/boundaries/kept_boundaries.h"
#include "paging/parts/cached_page_list.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The cuts of a hybrid cache (prefix caching on, a full-attention group and sliding-window groups): the data; the
//! operations are PageManager::State's (page_manager_cuts.cpp).
//!
//! A prefix of k whole pages is adoptable when the full-attention group has its pages 0..k-1 cached and each windowed
//! group the pages its window at token k * tokensPerPage reaches (the last ceil((W - 1) / tokensPerPage) or so). Per
//! group LRU would let a small windowed group drop those pages long before the full-attention ones, leaving a prefix
//! that is cached but never adoptable. A cut keeps one such window as a unit: it is attached to the full-attention
//! page of its entry k - 1 (at most one cut a page: the hash fixes k) and anchors the pages of its window in every
//! windowed group, which the windowed groups then evict only after every page no cut needs. A cut goes when its
//! full-attention page is evicted, or when a windowed group must evict and has nothing else: the clock with hit counts
//! that every kept boundary shares (KeptBoundaries) chooses it, an adoption of the cut's prefix counting a hit, so a
//! cut that is adopted outlives many that are made and never adopted. The pages it leaves without anchor and holder are
//! evicted next.
struct PrefixCuts
{
    //! The full-attention group cuts are attached to; -1 when the cache is not hybrid (then there are no cuts).
    int32_t fullGroup = -1;
    //! The windowed groups, ascending.
    std::vector<int32_t> windowedGroups;
    //! Per page of fullGroup: the length in pages of the cut it carries, 0 for none.
    std::vector<int32_t> cutPages;
    //! The pages of fullGroup that carry a cut (each its own carrier), and which cut a windowed group drops.
    KeptBoundaries kept;
    //! Per windowed group (index into windowedGroups) and page of fullGroup: the windowed page of the cut's last entry.
    std::vector<std::vector<int32_t>> tail;
    //! Per windowed group and windowed page: the page before it in the window of the cuts that anchor it (every such
    //! cut has the same, the pages' hashes being chained), unused for a window's first page.
    std::vector<std::vector<int32_t>> previous;
    //! Scratch of one cut: its window's pages in every windowed group, concatenated.
    std::vector<int32_t> window;

    //! Returns whether the cache is hybrid (cuts are made).
    bool enabled() const noexcept
    {
        return fullGroup >= 0;
    }
    //! Returns the number of cuts.
    int32_t size() const noexcept
    {
        return kept.size();
    }
};

} // namespace kvcache::rt
