// TieredPrefixCache: the host tiers it owns, the mover that turns the core's decisions into HostTier transfers and
// page copies on the call's stream, and the checks that need CUDA (a capturing stream).
#include "kvcache/tiers/tiered_prefix_cache.h"

#include "core/cuda_owners.h"
#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/tiers/sequence_file.h"

#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <system_error>
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

//! Returns the file of disk page `diskPage` of group `group` in `directory`.
std::string diskPagePath(std::string const& directory, int32_t group, int32_t diskPage)
{
    return (std::filesystem::path(directory) / fmt::format("group{}-page{}.kvseq", group, diskPage)).string();
}

//! The core's transfers as HostTier transfers and page copies, enqueued on one stream, and its disk pages as
//! one-page sequence files (written and read on the host, synchronously).
class StreamMover final : public detail::TierMover
{
public:
    StreamMover(KVCacheManager const& cache, std::vector<std::unique_ptr<HostTier>> const& tiers,
        std::string const& diskDirectory, int32_t checkpointGroup, cudaStream_t stream)
        : mCache(cache)
        , mTiers(tiers)
        , mDiskDirectory(diskDirectory)
        , mCheckpointGroup(checkpointGroup)
        , mStream(stream)
    {
    }

    void spill(int32_t group, int32_t hostPage, int32_t diskPage, int32_t hostState) override
    {
        // saveSequence waits for the tier's transfers touching the host page (and state), then writes the file
        // atomically; the checkpoint group's tier holds the host states.
        std::string const path = diskPagePath(mDiskDirectory, group, diskPage);
        if (hostState >= 0)
        {
            saveSequence(path, tier(group), mCache, &hostPage, 1, mCache.layout().tokensPerPage, hostState);
            return;
        }
        saveSequence(path, tier(group), mCache, &hostPage, 1, mCache.layout().tokensPerPage);
    }
    void restore(int32_t group, int32_t diskPage, int32_t hostPage, int32_t hostState) override
    {
        std::string const path = diskPagePath(mDiskDirectory, group, diskPage);
        try
        {
            int64_t const tokens = hostState >= 0 ? loadSequence(path, tier(group), mCache, &hostPage, 1, hostState)
                                                  : loadSequence(path, tier(group), mCache, &hostPage, 1);
            if (tokens != mCache.layout().tokensPerPage)
            {
                throw Error(fmt::format("TieredPrefixCache: disk page file '{}' holds {} tokens, not a page of {}",
                    path, tokens, mCache.layout().tokensPerPage));
            }
        }
        catch (CudaError const&)
        {
            throw;
        }
        catch (Error const&)
        {
            // The core drops the disk page; its file goes too, so that nothing stale is left to be found.
            std::error_code ignored;
            std::filesystem::remove(path, ignored);
            throw;
        }
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
    void offloadStates(HostStateEntry const* entries, int32_t count) override
    {
        tier(mCheckpointGroup).offloadStates(mCache, entries, count, mStream);
    }
    void onboardStates(HostStateEntry const* entries, int32_t count) override
    {
        tier(mCheckpointGroup).onboardStates(mCache, entries, count, mStream);
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
    std::string const& mDiskDirectory;
    int32_t mCheckpointGroup;
    cudaStream_t mStream;
};

//! Checks the layouts and sizes before any tier pins memory, so that a bad argument costs nothing.
KVCacheManager const& checkedCache(
    KVCacheManager const& cache, PageManager const& pages, TieredPrefixCacheOptions const& options)
{
    detail::checkSameLayout(cache.layout(), pages.layout());
    detail::checkNumHostPages(cache.layout(), options.numHostPages);
    detail::checkNumDiskPages(cache.layout(), options.numDiskPages);
    detail::checkNumHostStates(options.numHostStates, detail::PageManagerInternal::checkpointGroup(pages));
    if (options.hostTier.numHostStates != 0)
    {
        throw InvalidArgumentError(fmt::format("TieredPrefixCache: hostTier.numHostStates is {}; it must be 0 (the "
                                               "cache sizes its host states with numHostStates)",
            options.hostTier.numHostStates));
    }
    if (options.minOffloadPriority < 0 || options.minOffloadPriority > PageManager::kMAX_RETENTION_PRIORITY)
    {
        throw InvalidArgumentError(fmt::format("TieredPrefixCache: minOffloadPriority is {}; it must be in [0, {}]",
            options.minOffloadPriority, PageManager::kMAX_RETENTION_PRIORITY));
    }
    if (options.diskDirectory.empty() != options.numDiskPages.empty())
    {
        throw InvalidArgumentError(fmt::format("TieredPrefixCache: diskDirectory is '{}' and numDiskPages has {} "
                                               "entries; a disk tier needs both, none needs neither",
            options.diskDirectory, options.numDiskPages.size()));
    }
    if (!options.diskDirectory.empty())
    {
        std::error_code error;
        std::filesystem::create_directories(options.diskDirectory, error);
        if (error || !std::filesystem::is_directory(options.diskDirectory))
        {
            throw InvalidArgumentError(fmt::format("TieredPrefixCache: diskDirectory '{}' is not a directory and "
                                                   "cannot be made one ({}); it must be a writable directory",
                options.diskDirectory, error ? error.message() : std::string("a file is in the way")));
        }
    }
    return cache;
}

} // namespace

struct TieredPrefixCache::Impl
{
    Impl(KVCacheManager const& cacheIn, PageManager& pages, TieredPrefixCacheOptions const& options)
        : cache(checkedCache(cacheIn, pages, options))
        , diskDirectory(options.diskDirectory)
    {
        tiers.reserve(options.numHostPages.size());
        int32_t const checkpointGroup = detail::PageManagerInternal::checkpointGroup(pages);
        for (size_t g = 0; g < options.numHostPages.size(); ++g)
        {
            // The host states belong to the tier of the group whose pages carry the checkpoints.
            HostTierOptions tierOptions = options.hostTier;
            tierOptions.numHostStates = static_cast<int32_t>(g) == checkpointGroup ? options.numHostStates : 0;
            tiers.push_back(
                std::make_unique<HostTier>(cache, static_cast<int32_t>(g), options.numHostPages[g], tierOptions));
        }
        // Last: it sets the manager's callback, which nothing after it may leave behind by throwing.
        core = std::make_unique<detail::TieredPrefixCacheCore>(
            pages, options.numHostPages, options.numDiskPages, options.numHostStates);
        core->setMinOffloadPriority(options.minOffloadPriority);
    }
    ~Impl()
    {
        // The disk tier lives as long as this object (its index is in memory): its files go with it.
        if (diskDirectory.empty() || core == nullptr)
        {
            return;
        }
        try
        {
            for (int32_t g = 0; g < core->numGroups(); ++g)
            {
                for (int32_t const diskPage : core->diskMap(g)->leastRecentFirst())
                {
                    std::error_code ignored;
                    std::filesystem::remove(diskPagePath(diskDirectory, g, diskPage), ignored);
                }
            }
        }
        catch (...)
        {
            // A destructor never throws; files left behind are overwritten by the next tier in the directory.
        }
    }
    Impl(Impl const&) = delete;
    Impl& operator=(Impl const&) = delete;

    KVCacheManager const& cache;
    std::string diskDirectory;
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
    StreamMover mover(mImpl->cache, mImpl->tiers, mImpl->diskDirectory, mImpl->core->checkpointGroup(), stream);
    return mImpl->core->admit(mover, sequence, tokens, count, extraKeys, numExtraKeys);
}

StepCopies TieredPrefixCache::step(SequenceAppend const* appends, int32_t count, cudaStream_t stream)
{
    checkNotCapturing("step", stream);
    StreamMover mover(mImpl->cache, mImpl->tiers, mImpl->diskDirectory, mImpl->core->checkpointGroup(), stream);
    return mImpl->core->step(mover, appends, count);
}

int32_t TieredPrefixCache::evictCached(int32_t group, int32_t count, cudaStream_t stream)
{
    checkNotCapturing("evictCached", stream);
    StreamMover mover(mImpl->cache, mImpl->tiers, mImpl->diskDirectory, mImpl->core->checkpointGroup(), stream);
    return mImpl->core->evictCached(mover, group, count);
}

void TieredPrefixCache::takeEvents(KVEventBatch& out)
{
    mImpl->core->takeEvents(out);
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

int32_t TieredPrefixCache::numDiskPagesHeld(int32_t group) const
{
    detail::HostPageMap const* const disk = mImpl->core->diskMap(group, "TieredPrefixCache::numDiskPagesHeld");
    return disk == nullptr ? 0 : disk->size();
}

int32_t TieredPrefixCache::findDiskPage(int32_t group, PageHash hash) const
{
    detail::HostPageMap const* const disk = mImpl->core->diskMap(group, "TieredPrefixCache::findDiskPage");
    return disk == nullptr ? -1 : disk->find(hash);
}

int32_t TieredPrefixCache::numHostStatesHeld() const noexcept
{
    detail::HostPageMap const* const states = mImpl->core->stateMap();
    return states == nullptr ? 0 : states->size();
}

int32_t TieredPrefixCache::findHostState(PageHash hash) const noexcept
{
    detail::HostPageMap const* const states = mImpl->core->stateMap();
    return states == nullptr ? -1 : states->find(hash);
}

int32_t TieredPrefixCache::checkpointGroup() const noexcept
{
    return mImpl->core->checkpointGroup();
}

void TieredPrefixCache::checkInvariants() const
{
    mImpl->core->checkInvariants();
}

} // namespace kvcache::rt
