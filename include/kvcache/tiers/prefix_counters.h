#pragma once

#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/tiered_prefix_cache.h"

#include <string>
#include <vector>

namespace kvcache::rt
{

//! One snapshot of a prefix cache's counters: the device tier's, the host and disk tiers' when a TieredPrefixCache
//! serves the manager, and each tenant's (salt's) hits per tier.
struct PrefixCacheCounters
{
    //! PageManager::stats(): prompt tokens queried and found on the device, evicted device pages, copy-on-write pages.
    PageManagerStats device = {};
    //! Whether `tiers` holds a TieredPrefixCache's counters.
    bool hasTiers = false;
    //! TieredPrefixCache::stats(): host and disk hits, offloads, onboards, host and disk evictions.
    TieredPrefixCacheStats tiers = {};
    //! PageManager::tenantStats().
    std::vector<PrefixTenantStats> tenants = {};
};

//! Returns the counters of `pages` and, when not null, of `tiered` (which must serve `pages`). Allocates the snapshot.
PrefixCacheCounters snapshotCounters(PageManager const& pages, TieredPrefixCache const* tiered = nullptr);

//! Returns `counters` in Prometheus' text exposition format (version 0.0.4), every metric a counter named
//! `<prefix>_..._total`: prefix_query_tokens; prefix_hit_tokens by tier ("device", and "host" and "disk" with tiers:
//! disjoint, a disk hit is not a host hit); evicted_pages by tier; copy_on_write_pages; with tiers offloaded_pages,
//! onboarded_pages, spilled_pages, restored_pages, disk_failures; per tenant (label tenant: the salt in hex, "" for
//! none, "other" for the bucket past PageManager::kMAX_TENANTS) tenant_prefix_query_tokens and
//! tenant_prefix_hit_tokens by tier. Throws InvalidArgumentError naming `prefix` when it is not a metric name
//! ([a-zA-Z_:][a-zA-Z0-9_:]*).
std::string toPrometheusText(PrefixCacheCounters const& counters, std::string const& prefix = "kvcache");

} // namespace kvcache::rt
