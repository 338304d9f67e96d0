#pragma once

// What a host tier's host page holds, from the formulas (docs/layout.md, "Host pages"): the data of every layer of the
// group, K page then V page, in layer order, then the scales of every layer in the same order; and host page helpers
// the host tier and sequence file tests share.

#include "kvcache/memory/page_ops.h"
#include "kvcache/tiers/host_tier.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "support/page_op_reference.h"

namespace kvcache::test
{

//! The byte host pages are poisoned with before a transfer or a load writes them.
inline constexpr uint8_t kHOST_PAGE_POISON = 0xAB;

//! Returns the bytes of host page `hostPage` of `tier`, after the tier's transfers touching it.
inline std::vector<uint8_t> hostPageContents(rt::HostTier& tier, int32_t hostPage)
{
    auto const* data = static_cast<uint8_t const*>(tier.hostPageData(hostPage));
    return std::vector<uint8_t>(data, data + tier.hostPageBytes());
}

//! Sets every byte of host page `hostPage` of `tier` to `poison`.
inline void poisonHostPage(rt::HostTier& tier, int32_t hostPage, uint8_t poison = kHOST_PAGE_POISON)
{
    std::memset(tier.hostPageData(hostPage), poison, static_cast<size_t>(tier.hostPageBytes()));
}

//! Returns the bytes a host page of page group `group` holds for page `page` of `reference`: each layer's K page then
//! its V page (a latent layer: its one page), layer by layer, then each layer's K scale page then V scale page
//! (none for a latent layer's V) in the same order.
inline std::vector<uint8_t> expectedHostPage(ReferenceCache& reference, int32_t group, int32_t page)
{
    std::vector<uint8_t> bytes;
    std::vector<int32_t> const& layers = reference.model().groups.at(static_cast<size_t>(group)).layers;
    for (int32_t const layer : layers)
    {
        for (int32_t kv = 0; kv < reference.numHalves(layer); ++kv)
        {
            uint8_t const* first = reference.page(layer, kv, page);
            bytes.insert(bytes.end(), first, first + reference.pageBytes(layer));
        }
    }
    for (int32_t const layer : layers)
    {
        for (int32_t kv = 0; kv < reference.numHalves(layer) && reference.scalePageBytes(layer) > 0; ++kv)
        {
            uint8_t const* first = reference.scalePage(layer, kv, page);
            bytes.insert(bytes.end(), first, first + reference.scalePageBytes(layer));
        }
    }
    return bytes;
}

//! Copies page `src` of `from` onto page `dst` of `to` (two models of one config) in every layer and half of page
//! group `group`, data and scales: what a page offloaded from `from` and onboarded elsewhere leaves in the cache.
inline void copyModelPage(ReferenceCache& to, ReferenceCache& from, int32_t group, int32_t src, int32_t dst)
{
    for (int32_t const layer : to.model().groups.at(static_cast<size_t>(group)).layers)
    {
        for (int32_t kv = 0; kv < to.numHalves(layer); ++kv)
        {
            std::memcpy(to.page(layer, kv, dst), from.page(layer, kv, src), static_cast<size_t>(to.pageBytes(layer)));
            if (to.scalePageBytes(layer) > 0)
            {
                std::memcpy(to.scalePage(layer, kv, dst), from.scalePage(layer, kv, src),
                    static_cast<size_t>(to.scalePageBytes(layer)));
            }
        }
    }
}

//! What device pages are reset to before an onboard writes them: no random page of CacheUnderTest has it (its bytes
//! are never 0).
inline constexpr uint32_t kDEVICE_PAGE_POISON = 0x00C0FFEEU;

//! Resets `pages` of page group `group` (every layer and half, data and scales) on the device and in the model.
inline void poisonDevicePages(CacheUnderTest& cut, std::vector<int32_t> const& pages, int32_t group)
{
    rt::PageOpTarget const wholeGroup{0, -1, rt::KVHalf::kBOTH, group};
    rt::resetPages(cut.cache(), pages, cut.stream(), kDEVICE_PAGE_POISON, wholeGroup);
    cut.reference().reset(pages, kDEVICE_PAGE_POISON, wholeGroup);
}

//! Returns the entries pairing `pages[i]` with `hostPages[i]`.
inline std::vector<rt::HostTierEntry> pairEntries(
    std::vector<int32_t> const& pages, std::vector<int32_t> const& hostPages)
{
    std::vector<rt::HostTierEntry> entries;
    for (size_t i = 0; i < pages.size() && i < hostPages.size(); ++i)
    {
        entries.push_back(rt::HostTierEntry{pages[i], hostPages[i]});
    }
    return entries;
}

//! Returns `count` pages of page group `group` and `count` other pages of it, in random order.
inline std::pair<std::vector<int32_t>, std::vector<int32_t>> twoPageLists(
    CacheUnderTest& cut, int32_t group, int32_t count)
{
    std::vector<int32_t> const pages = cut.randomPages(2 * count, group);
    return {std::vector<int32_t>(pages.begin(), pages.begin() + count),
        std::vector<int32_t>(pages.begin() + count, pages.end())};
}

//! Poisons `hostPages` and fills them with `toHost(entries of sources and hostPages)`, then checks every host page
//! byte against the model (expectedHostPage); resets `sources` and `destinations` on the device, moves the host pages
//! into `destinations` with `toDevice(entries of destinations and hostPages)` and checks every byte of every layer,
//! data and scales, against the model, destination i holding what source i held. `settle()` runs before host pages
//! or device bytes are read (a host-list transfer needs nothing; a device list, a stream synchronisation).
template <typename ToHost, typename ToDevice, typename Settle>
void roundTrip(CacheUnderTest& cut, rt::HostTier& tier, std::vector<int32_t> const& sources,
    std::vector<int32_t> const& destinations, std::vector<int32_t> const& hostPages, ToHost&& toHost,
    ToDevice&& toDevice, Settle&& settle)
{
    int32_t const group = tier.group();
    for (int32_t const hostPage : hostPages)
    {
        poisonHostPage(tier, hostPage);
    }
    toHost(pairEntries(sources, hostPages));
    settle();
    for (size_t i = 0; i < sources.size(); ++i)
    {
        ASSERT_EQ(hostPageContents(tier, hostPages[i]), expectedHostPage(cut.reference(), group, sources[i]))
            << "host page " << hostPages[i] << " holding page " << sources[i];
    }
    ReferenceCache offloaded = cut.reference();
    std::vector<int32_t> poisoned = sources;
    poisoned.insert(poisoned.end(), destinations.begin(), destinations.end());
    poisonDevicePages(cut, poisoned, group);
    ASSERT_TRUE(cut.matchesReference()) << "the reset before the onboard";
    toDevice(pairEntries(destinations, hostPages));
    settle();
    for (size_t i = 0; i < sources.size(); ++i)
    {
        copyModelPage(cut.reference(), offloaded, group, sources[i], destinations[i]);
    }
    ASSERT_TRUE(cut.matchesReference()) << "after the onboard";
}

} // namespace kvcache::test
