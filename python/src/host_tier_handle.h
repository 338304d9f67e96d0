#pragma once

// The HostTier Python object (host_tier_binding.cpp) as the other binding files reach it: a tier it owns, or one a
// TieredPrefixCache owns and lends it.

#include "write_binding.h"

#include <kvcache/tiers/host_tier.h>

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvcache::python
{

namespace nb = nanobind;

//! A HostTier and the KVCacheManager object it moves pages of, which it keeps alive: either a tier it owns (the
//! manager object goes after the tier: declared first), or the tier of a TieredPrefixCache (host_tier(g)), whose
//! Python object it keeps alive in turn (that object keeps the manager alive).
class TierHandle
{
public:
    //! Makes a tier of its own: HostTier(cache, group, numHostPages, options). Throws TypeError when `cache` is no
    //! KVCacheManager, and what HostTier's constructor throws.
    TierHandle(nb::handle cache, int64_t group, int64_t numHostPages, rt::HostTierOptions const& options);
    //! Lends `tier`, owned by the Python object `owner` (a TieredPrefixCache), a tier of the KVCacheManager object
    //! `cache`.
    TierHandle(nb::handle owner, nb::handle cache, rt::HostTier& tier);

    rt::HostTier& tier() noexcept
    {
        return *mTier;
    }
    rt::KVCacheManager const& manager() const noexcept
    {
        return *mCache.manager;
    }
    //! The stream transfers run on when the call names none: the cache's.
    cudaStream_t cacheStream() const noexcept
    {
        return mCache.stream;
    }
    //! Whether a TieredPrefixCache owns the tier (and its host pages: the handle refuses to hand out or release them).
    bool isLent() const noexcept
    {
        return mOwner.is_valid();
    }
    //! Throws InvalidArgumentError naming the call `what` when the tier is lent: a call that writes or hands out its
    //! host pages would change what the TieredPrefixCache holds under a page's hash.
    void refuseIfLent(char const* what) const;
    //! Host lists are read into these, reused between calls so that a call allocates nothing in steady state.
    std::vector<rt::HostTierEntry> entries;
    std::vector<rt::HostStateEntry> stateEntries;
    std::vector<int32_t> hostPages;

private:
    nb::object mCacheObject;
    CacheAccess mCache;
    nb::object mOwner;
    std::unique_ptr<rt::HostTier> mOwnedTier;
    rt::HostTier* mTier = nullptr;
};

//! Returns the HostTier object `tier` is; throws TypeError naming it otherwise.
TierHandle& tierArgument(nb::handle tier);

//! Returns the keyword parameters HostTier takes for its options, with their defaults, as a signature declares them
//! (TieredPrefixCache takes them too).
std::string hostTierOptionParameters();

} // namespace kvcache::python
