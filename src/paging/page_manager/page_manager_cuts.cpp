// The cuts of a hybrid cache (prefix_cuts.h): which caches make them, eviction across the groups, making and dropping
// cuts, and their invariants.
#include "paging/page_manager/page_manager_state.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvcache::rt
{

void PageManager::State::setUpCuts(int32_t maxEntries)
{
    // Hybrid: prefix caching, and a full-attention group for the windowed groups' cuts to hang on (a cache of windowed
    // groups only, or of one group, keeps plain per-group LRU).
    int32_t full = -1;
    std::vector<int32_t> windowed;
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        if (!policies[static_cast<size_t>(g)].windowed())
        {
            full = full < 0 ? g : full;
        }
        else
        {
            windowed.push_back(g);
        }
    }
    if (!options.enablePrefixCaching || full < 0 || windowed.empty())
    {
        return;
    }
    int32_t const fullPages = pools[static_cast<size_t>(full)].pages.numPages();
    cuts.fullGroup = full;
    cuts.windowedGroups = windowed;
    cuts.cutPages.assign(static_cast<size_t>(fullPages), 0);
    cuts.kept = KeptBoundaries(fullPages, fullPages);
    for (int32_t const g : windowed)
    {
        PagePool& pool = pools[static_cast<size_t>(g)];
        pool.enableAnchors();
        cuts.tail.emplace_back(static_cast<size_t>(fullPages), CachedPageList::kNONE);
        cuts.previous.emplace_back(static_cast<size_t>(pool.pages.numPages()), CachedPageList::kNONE);
    }
    // A window has fewer pages than a sequence's entries.
    cuts.window.reserve(static_cast<size_t>(maxEntries) * windowed.size());
}

int32_t PageManager::State::evictOne(int32_t group)
{
    PagePool& pool = pools[static_cast<size_t>(group)];
    // Only a windowed group of a hybrid cache can have cached pages and an empty list: its cached pages are all in
    // cut windows. The clock's choices give way until one leaves a page no other cut needs.
    while (pool.cached.size() == 0)
    {
        dropCut(cuts.kept.choose([](int32_t) { return false; }, [](int32_t carrier) { return carrier; }));
    }
    int32_t const page = prefix.evictOldest(group, pool);
    // A boundary made again at this page later is another prefix's: forget what was dropped here.
    if (group == cuts.fullGroup)
    {
        cuts.kept.carrierEvicted(page);
    }
    if (group == checkpoints.carrierGroup)
    {
        checkpoints.kept.carrierEvicted(page);
    }
    // No adoptable prefix ends at this page any more: its cut's windows and its checkpoint serve nothing.
    if (group == cuts.fullGroup && cuts.cutPages[static_cast<size_t>(page)] != 0)
    {
        dropCut(page);
    }
    if (group == checkpoints.carrierGroup && checkpoints.byCarrier[static_cast<size_t>(page)] >= 0)
    {
        int32_t const index = checkpoints.byCarrier[static_cast<size_t>(page)];
        // A saved state goes with its page to another tier (the eviction callback learns its slot); one still
        // filling holds no state yet.
        if (checkpoints.adoptable(index))
        {
            prefix.markEvictedState(checkpoints.firstSlot + index);
        }
        dropCheckpoint(index);
    }
    return page;
}

void PageManager::State::makeCut(int32_t row, int32_t pages, bool adopted)
{
    if (!cuts.enabled() || pages <= 0)
    {
        return;
    }
    PageHash const* hashes = sequences.hashes(row);
    int32_t const carrier = prefix.find(cuts.fullGroup, hashes[pages - 1]);
    if (carrier == PageHashTable::kNONE_PAGE)
    {
        return;
    }
    size_t const at = static_cast<size_t>(carrier);
    if (cuts.cutPages[at] != 0)
    {
        if (adopted)
        {
            cuts.kept.hit(carrier);
        }
        return;
    }
    // Every window page is looked up before any is anchored: a cut with a page missing would keep the others for
    // nothing.
    cuts.window.clear();
    for (int32_t const g : cuts.windowedGroups)
    {
        for (int32_t p = policies[static_cast<size_t>(g)].firstAdopted(pages, tokensPerPage); p < pages; ++p)
        {
            int32_t const page = prefix.find(g, hashes[p]);
            if (page == PageHashTable::kNONE_PAGE)
            {
                return;
            }
            cuts.window.push_back(page);
        }
    }
    size_t next = 0;
    for (size_t w = 0; w < cuts.windowedGroups.size(); ++w)
    {
        int32_t const g = cuts.windowedGroups[w];
        PagePool& pool = pools[static_cast<size_t>(g)];
        int32_t const count = pages - policies[static_cast<size_t>(g)].firstAdopted(pages, tokensPerPage);
        int32_t before = CachedPageList::kNONE;
        for (int32_t i = 0; i < count; ++i, ++next)
        {
            int32_t const page = cuts.window[next];
            pool.anchor(page);
            if (i > 0)
            {
                cuts.previous[w][static_cast<size_t>(page)] = before;
            }
            before = page;
        }
        cuts.tail[w][at] = before;
    }
    cuts.cutPages[at] = pages;
    cuts.kept.add(carrier, carrier);
    if (adopted)
    {
        cuts.kept.hit(carrier);
    }
}

void PageManager::State::dropCut(int32_t page)
{
    size_t const at = static_cast<size_t>(page);
    int32_t const pages = cuts.cutPages[at];
    cuts.cutPages[at] = 0;
    cuts.kept.remove(page);
    for (size_t w = 0; w < cuts.windowedGroups.size(); ++w)
    {
        int32_t const g = cuts.windowedGroups[w];
        PagePool& pool = pools[static_cast<size_t>(g)];
        int32_t const count = pages - policies[static_cast<size_t>(g)].firstAdopted(pages, tokensPerPage);
        cuts.window.clear();
        for (int32_t i = 0, walk = cuts.tail[w][at]; i < count; ++i)
        {
            cuts.window.push_back(walk);
            walk = i + 1 < count ? cuts.previous[w][static_cast<size_t>(walk)] : CachedPageList::kNONE;
        }
        // From the window's first page to its last, each to the front: the last is evicted first.
        for (int32_t i = count - 1; i >= 0; --i)
        {
            int32_t const windowPage = cuts.window[static_cast<size_t>(i)];
            if (pool.unanchor(windowPage))
            {
                pool.listOldest(windowPage);
            }
        }
    }
}

namespace
{

[[noreturn]] void fail(std::string const& message)
{
    throw std::logic_error("PageManager invariant: " + message);
}

} // namespace

void PageManager::State::checkCutInvariants() const
{
    // Anchor counts recounted from the cuts' windows; each window's pages registered under the hashes of one chain
    // ending at the carrier's (the last page's hash is the carrier's own).
    std::vector<std::vector<int32_t>> anchors(cuts.windowedGroups.size());
    for (size_t w = 0; w < cuts.windowedGroups.size(); ++w)
    {
        anchors[w].assign(static_cast<size_t>(pools[static_cast<size_t>(cuts.windowedGroups[w])].pages.numPages()), 0);
    }
    int32_t counted = 0;
    int32_t previous = CachedPageList::kNONE;
    int32_t const fullPages = cuts.enabled() ? pools[static_cast<size_t>(cuts.fullGroup)].pages.numPages() : 0;
    for (int32_t carrier = cuts.kept.clock().first(); carrier != HitClock::kNONE;
         carrier = cuts.kept.clock().next(carrier))
    {
        if (carrier < 0 || carrier >= fullPages || cuts.kept.clock().previous(carrier) != previous
            || counted > fullPages)
        {
            fail(fmt::format("the clock of cuts is broken at page {}", carrier));
        }
        int32_t const hits = cuts.kept.clock().hits(carrier);
        if (hits < 0 || hits > HitClock::kMAX_HITS)
        {
            fail(fmt::format("the cut at group {} page {} counts {} hits", cuts.fullGroup, carrier, hits));
        }
        previous = carrier;
        ++counted;
        int32_t const pages = cuts.cutPages[static_cast<size_t>(carrier)];
        if (pages <= 0 || !prefix.isRegistered(cuts.fullGroup, carrier))
        {
            fail(fmt::format("group {} page {} is on the list of cuts with {} pages, registered {}", cuts.fullGroup,
                carrier, pages, prefix.isRegistered(cuts.fullGroup, carrier)));
        }
        PageHash const carried = prefix.hashOf(cuts.fullGroup, carrier);
        for (size_t w = 0; w < cuts.windowedGroups.size(); ++w)
        {
            int32_t const g = cuts.windowedGroups[w];
            int32_t const count = pages - policies[static_cast<size_t>(g)].firstAdopted(pages, tokensPerPage);
            int32_t walk = cuts.tail[w][static_cast<size_t>(carrier)];
            if (count > 0 && !(prefix.isRegistered(g, walk) && prefix.hashOf(g, walk) == carried))
            {
                fail(fmt::format("the cut of {} pages at group {} page {} ends at group {} page {}, not registered "
                                 "under the same hash",
                    pages, cuts.fullGroup, carrier, g, walk));
            }
            for (int32_t i = 0; i < count; ++i)
            {
                if (walk < 0 || walk >= static_cast<int32_t>(anchors[w].size()) || !prefix.isRegistered(g, walk))
                {
                    fail(fmt::format("the cut of {} pages at group {} page {} has page {} of group {} in its window, "
                                     "not registered",
                        pages, cuts.fullGroup, carrier, walk, g));
                }
                ++anchors[w][static_cast<size_t>(walk)];
                walk = i + 1 < count ? cuts.previous[w][static_cast<size_t>(walk)] : CachedPageList::kNONE;
            }
        }
    }
    if (previous != cuts.kept.clock().last() || counted != cuts.kept.clock().size())
    {
        fail(fmt::format("the clock of cuts holds {} pages, counted {}", cuts.kept.clock().size(), counted));
    }
    int32_t carriers = 0;
    for (int32_t p = 0; p < fullPages; ++p)
    {
        carriers += cuts.cutPages[static_cast<size_t>(p)] != 0 ? 1 : 0;
    }
    if (carriers != counted)
    {
        fail(fmt::format("{} full-attention pages carry a cut; the clock of cuts holds {}", carriers, counted));
    }
    for (int32_t p = 0; p < fullPages; ++p)
    {
        if (cuts.kept.remembersDrop(p)
            && (cuts.cutPages[static_cast<size_t>(p)] != 0 || !prefix.isRegistered(cuts.fullGroup, p)))
        {
            fail(fmt::format(
                "group {} page {} remembers a dropped cut but carries one or is not registered", cuts.fullGroup, p));
        }
    }
    if (cuts.kept.clock().target() < 0 || cuts.kept.clock().target() > fullPages
        || cuts.kept.clock().numNeverHit() > cuts.kept.clock().size())
    {
        fail(fmt::format("the clock of cuts has a target of {} and {} of its {} cuts never hit",
            cuts.kept.clock().target(), cuts.kept.clock().numNeverHit(), cuts.kept.clock().size()));
    }
    for (size_t w = 0; w < cuts.windowedGroups.size(); ++w)
    {
        int32_t const g = cuts.windowedGroups[w];
        PagePool const& pool = pools[static_cast<size_t>(g)];
        for (int32_t p = 0; p < pool.pages.numPages(); ++p)
        {
            if (pool.anchors[static_cast<size_t>(p)] != anchors[w][static_cast<size_t>(p)])
            {
                fail(fmt::format("group {} page {} has {} anchors and is in {} cut windows", g, p,
                    pool.anchors[static_cast<size_t>(p)], anchors[w][static_cast<size_t>(p)]));
            }
        }
    }
}

} // namespace kvcache::rt
