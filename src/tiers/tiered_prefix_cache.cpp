// TieredPrefixCache: the host tiers it owns, the mover that turns the core's decisions into HostTier transfers and
// page copies on the call's stream, and the checks that need CUDA (a capturing stream).
#include "kvcache/tiers/tiered_prefix_cache.h"

#include "core/cuda_owners.h"
#include "tiers/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <fmt/format.h>

#include <utility>

namespace kvcache::rt
{
namespace
{

//! Throws InvalidArgumentError naming `what` when `stream` is capturing a graph: HostTier's host-list transfers query
//! events, which a capture forbids, and a refusal after the manager changed would leave pages without their bytes.
void checkNotCapturing(char const* what, cudaStream_t stream)
{
    cudaStreamCaptureStatus const status = detail::captureStatus(stream);
    if (status != cudaStreamCaptureStatusNone)
    {
        throw InvalidArgumentError(fmt::format("TieredPrefixCache::{}: the stream is capturing a graph (status {}); "
                                               "host-list transfers cannot be captured: call it outside the capture",
            what, static_cast<int>(status)));
    }
}

//! The core's transfers as HostTier transfers and page copies, enqueued on one stream.
class StreamMover final : public detail::TierMover
{
public:
    StreamMover(KVCacheManager const& cache, std::vector<std::unique_ptr<HostTier>> const& tiers, cudaStream_t stream)
        : mCache(cache)
        , mTiers(tiers)
        , mStream(stream)
    {
    }

    int64_t usableHostPages(int32_t group) const override
    {
        return tier(group).numPinnedHostPages();
    }
    void offload(int32_t group, HostTierEntry const* entries, int32_t count) override
    {
        tier(group).offload(mCache, entries, count, mStream);
    }
    void onboard(int32_t group, HostTierEntry const* entries, int32_t count) override
    {
        tier(group).onboard(mCache, entries, count, mStream);
    }
    void copy(int32_t group, PageCopy const* copies, int32_t count) override
    {
        PageOpTarget target;
        target.group = group;
        copyPages(mCache, copies, count, mStream, target);
    }

private:
    HostTier& tier(int32_t group) const
    {
        return *mTiers[static_cast<size_t>(group)];
    }

    KVCacheManager const& mCache;
    std::vector<std::unique_ptr<HostTier>> const& mTiers;
    cudaStream_t mStream;
};

//! Checks the layouts and sizes before any tier pins memory, so that a bad argument costs nothing.
KVCacheManager const& checkedCache(
    KVCacheManager const& cache, PageManager const& pages, TieredPrefixCacheOptions const& options)
{
    detail::checkSameLayout(cache.layout(), pages.layout());
    detail::checkNumHostPages(cache.layout(), options.numHostPages);
    return cache;
}

} // namespace

struct TieredPrefixCache::Impl
{
    Impl(KVCacheManager const& cacheIn, PageManager& pages, TieredPrefixCacheOptions const& options)
        : cache(checkedCache(cacheIn, pages, options))
    {
        tiers.reserve(options.numHostPages.size());
        for (size_t g = 0; g < options.numHostPages.size(); ++g)
        {
            tiers.push_back(
                std::make_unique<HostTier>(cache, static_cast<int32_t>(g), options.numHostPages[g], options.hostTier));
        }
        // Last: it sets the manager's callback, which nothing after it may leave behind by throwing.
        core = std::make_unique<detail::TieredPrefixCacheCore>(pages, options.numHostPages);
    }

    KVCacheManager const& cache;
    std::vector<std::unique_ptr<HostTier>> tiers;
    // Declared after the tiers so that it is destroyed first: the callback is cleared before the tiers go.
    std::unique_ptr<detail::TieredPrefixCacheCore> core;
};

TieredPrefixCache::TieredPrefixCache(
    KVCacheManager const& cache, PageManager& pages, TieredPrefixCacheOptions const& options)
    : mImpl(std::make_unique<Impl>(cache, pages, options))
{
}

TieredPrefixCache::~TieredPrefixCache() = default;
TieredPrefixCache::TieredPrefixCache(TieredPrefixCache&& other) noexcept = default;

TieredAdmission TieredPrefixCache::admit(SequenceId sequence, int32_t const* tokens, int32_t count, cudaStream_t stream,
    PageExtraKey const* extraKeys, int32_t numExtraKeys)
{
    checkNotCapturing("admit", stream);
    StreamMover mover(mImpl->cache, mImpl->tiers, stream);
    return mImpl->core->admit(mover, sequence, tokens, count, extraKeys, numExtraKeys);
}

StepCopies TieredPrefixCache::step(SequenceAppend const* appends, int32_t count, cudaStream_t stream)
{
    checkNotCapturing("step", stream);
    StreamMover mover(mImpl->cache, mImpl->tiers, stream);
    return mImpl->core->step(mover, appends, count);
}

int32_t TieredPrefixCache::evictCached(int32_t group, int32_t count, cudaStream_t stream)
{
    checkNotCapturing("evictCached", stream);
    StreamMover mover(mImpl->cache, mImpl->tiers, stream);
    return mImpl->core->evictCached(mover, group, count);
}

TieredPrefixCacheStats TieredPrefixCache::stats() const noexcept
{
    return mImpl->core->stats();
}

void TieredPrefixCache::resetStats() noexcept
{
    mImpl->core->resetStats();
}

int32_t TieredPrefixCache::numGroups() const noexcept
{
    return mImpl->core->numGroups();
}

HostTier& TieredPrefixCache::hostTier(int32_t group) const
{
    mImpl->core->hostMap(group, "TieredPrefixCache::hostTier");
    return *mImpl->tiers[static_cast<size_t>(group)];
}

int32_t TieredPrefixCache::numHostPagesHeld(int32_t group) const
{
    return mImpl->core->hostMap(group, "TieredPrefixCache::numHostPagesHeld").size();
}

int32_t TieredPrefixCache::findHostPage(int32_t group, PageHash hash) const
{
    return mImpl->core->hostMap(group, "TieredPrefixCache::findHostPage").find(hash);
}

void TieredPrefixCache::checkInvariants() const
{
    mImpl->core->checkInvariants();
}

} // namespace kvcache::rt
