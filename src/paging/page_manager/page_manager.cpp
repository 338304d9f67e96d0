// The PageManager façade: construction from the layout, and each public call checked and handed to the parts
// (page_manager_state.h).
#include "kvcache/paging/page_manager.h"

#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvcache::rt
{
namespace
{

//! Returns the hasher `options` ask for.
PageHasher hasherOf(PageManagerOptions const& options)
{
    return options.hashSeed ? PageHasher(options.hashAlgorithm, *options.hashSeed) : PageHasher(options.hashAlgorithm);
}

//! Returns the numPages of every group of `layout`.
std::vector<int32_t> groupPages(KVCacheLayout const& layout)
{
    std::vector<int32_t> pages;
    for (KVPageGroupLayout const& group : layout.groups)
    {
        pages.push_back(group.numPages);
    }
    return pages;
}

//! Returns `layout` after checking what the manager relies on (a layout of computeLayout passes).
KVCacheLayout const& checkedLayout(KVCacheLayout const& layout, PageManagerOptions const& options)
{
    if (layout.groups.empty())
    {
        throw InvalidArgumentError("PageManager: the layout has no page groups; it must have at least 1 (a cache "
                                   "without layers has no pages to manage)");
    }
    if (layout.maxSequenceLength <= 0 || layout.tokensPerPage <= 0
        || (layout.tokensPerPage & (layout.tokensPerPage - 1)) != 0 || layout.maxTokensPerStep <= 0)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager: the layout has maxSequenceLength {}, tokensPerPage {}, maxTokensPerStep {}; they must be > "
            "0, tokensPerPage a power of two (use computeLayout or KVCacheManager::layout())",
            layout.maxSequenceLength, layout.tokensPerPage, layout.maxTokensPerStep));
    }
    if (options.checkpointIntervalPages < 0)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager: options.checkpointIntervalPages is {}; it must be >= 0 (0: no periodic checkpoints)",
            options.checkpointIntervalPages));
    }
    if (options.maxSequences < 0)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager: options.maxSequences is {}; it must be >= 0 (0 means maxBatchSize)", options.maxSequences));
    }
    if (!layout.stateLayers.empty())
    {
        // A sequence's state slot is its row: the rows must fit in the slots of running sequences.
        if (layout.numStateSlots < layout.maxBatchSize)
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager: the layout has {} state layers and numStateSlots {}; it must be >= maxBatchSize {} (use "
                "computeLayout or KVCacheManager::layout())",
                layout.stateLayers.size(), layout.numStateSlots, layout.maxBatchSize));
        }
        if (options.maxSequences > layout.maxBatchSize)
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager: options.maxSequences is {}; with state layers it must be <= maxBatchSize {} (each "
                "sequence holds one of the maxBatchSize state slots of running sequences)",
                options.maxSequences, layout.maxBatchSize));
        }
    }
    return layout;
}

} // namespace

PageManager::State::State(KVCacheLayout const& source, PageManagerOptions const& opts)
    : layout(checkedLayout(source, opts))
    , options(opts)
    , maxSequenceLength(source.maxSequenceLength)
    , tokensPerPage(source.tokensPerPage)
    , maxTokensPerStep(source.maxTokensPerStep)
    , prefix(groupPages(source), hasherOf(opts), opts.enablePrefixCaching, source.tokensPerPage)
{
    while ((int32_t{1} << pageShift) < tokensPerPage)
    {
        ++pageShift;
    }
    pageMask = tokensPerPage - 1;
    int32_t const maxEntries = static_cast<int32_t>(pagesFor(maxSequenceLength));
    int32_t const maxSequences = opts.maxSequences > 0 ? opts.maxSequences : layout.maxBatchSize;
    for (KVPageGroupLayout const& group : layout.groups)
    {
        pools.emplace_back(group.numPages);
        policies.emplace_back(group.slidingWindow, group.pagesPerSequence, pageShift);
        anyWindowed = anyWindowed || policies.back().windowed();
        copies.emplace_back().reserve(static_cast<size_t>(maxSequences));
    }
    setUpCuts(maxEntries);
    sequences = SequenceTable(maxSequences, maxEntries, numGroups(), tokensPerPage, cuts.enabled());
    stateSlots = !layout.stateLayers.empty();
    setUpCheckpoints();
    if (stateSlots)
    {
        // One copy per live fork child or restored sequence, and one per checkpoint slot a save fills.
        size_t const maxCopies = static_cast<size_t>(maxSequences) + static_cast<size_t>(checkpoints.size());
        pendingStateCopies.reserve(maxCopies);
        stateCopies.reserve(maxCopies);
    }
    setUpEvents(maxEntries);
    stepNeeded.assign(layout.groups.size(), 0);
    stepReleased.assign(layout.groups.size(), 0);
    promptHashes.reserve(static_cast<size_t>(maxEntries));
    tenants.reserve(static_cast<size_t>(kMAX_TENANTS));
    otherTenant.other = true;
    promptPages.reserve(static_cast<size_t>(maxEntries) * layout.groups.size());
}

void PageManager::State::checkGroup(int32_t group, char const* what) const
{
    if (group < 0 || group >= numGroups())
    {
        throw OutOfRangeError(
            fmt::format("PageManager::{}: group {} is out of range; it must be in [0, {})", what, group, numGroups()));
    }
}

std::vector<PageCopy> const& StepCopies::operator[](int32_t group) const
{
    if (group < 0 || group >= mNumGroups)
    {
        throw OutOfRangeError(
            fmt::format("StepCopies: group {} is out of range; it must be in [0, {})", group, mNumGroups));
    }
    return mGroups[group];
}

bool StepCopies::empty() const noexcept
{
    return size() == 0;
}

int64_t StepCopies::size() const noexcept
{
    int64_t total = 0;
    for (int32_t g = 0; g < mNumGroups; ++g)
    {
        total += static_cast<int64_t>(mGroups[g].size());
    }
    return total;
}

PageManager::PageManager(KVCacheLayout const& layout, PageManagerOptions const& options)
    : mState(std::make_unique<State>(layout, options))
{
}

PageManager::PageManager(KVCacheConfig const& config, PageManagerOptions const& options)
    : PageManager(computeLayout(config), options)
{
}

PageManager::~PageManager() = default;
PageManager::PageManager(PageManager&&) noexcept = default;
PageManager& PageManager::operator=(PageManager&&) noexcept = default;

SequenceId PageManager::create(SequenceOptions const& options)
{
    State& s = *mState;
    if (options.salt == nullptr && options.saltBytes > 0)
    {
        throw InvalidArgumentError(
            fmt::format("PageManager::create: options.salt is null with saltBytes {}; it must point to saltBytes bytes",
                options.saltBytes));
    }
    PageHash const root = s.prefix.hasher().root(options.salt, options.saltBytes);
    int32_t const row = s.sequences.take("create");
    SequenceState& sequence = s.sequences[row];
    try
    {
        // A new tenant's salt is copied, and with KV events the sequence's: the row is given back if either fails.
        sequence.tenant = s.tenantOf(root, options.salt, options.saltBytes);
        if (s.recordsEvents())
        {
            auto const* salt = static_cast<uint8_t const*>(options.salt);
            sequence.salt.assign(salt, salt + options.saltBytes);
            s.keysSeen = s.keysSeen || options.saltBytes > 0;
        }
    }
    catch (...)
    {
        s.sequences.release(row);
        throw;
    }
    sequence.root = root;
    sequence.lastHash = root;
    return s.sequences.idOf(row);
}

int32_t PageManager::adoptPrefix(
    SequenceId sequence, int32_t const* tokens, int32_t count, PageExtraKey const* extraKeys, int32_t numExtraKeys)
{
    return mState->adoptPrefix(
        mState->sequences.rowOf(sequence, "adoptPrefix"), tokens, count, extraKeys, numExtraKeys);
}

StepCopies PageManager::append(SequenceAppend const& append)
{
    return mState->step(&append, 1);
}

StepCopies PageManager::step(SequenceAppend const* appends, int32_t count)
{
    return mState->step(appends, count);
}

void PageManager::pagesNeeded(SequenceAppend const* appends, int32_t count, int64_t* out) const
{
    State const& s = *mState;
    if (out == nullptr)
    {
        throw InvalidArgumentError("PageManager::pagesNeeded: out is null; it must point to numGroups() values");
    }
    s.checkStep(appends, count);
    s.countStep(appends, count, s.stepNeeded.data(), s.stepReleased.data());
    for (int32_t g = 0; g < s.numGroups(); ++g)
    {
        out[g] = s.stepNeeded[static_cast<size_t>(g)] - s.stepReleased[static_cast<size_t>(g)];
    }
}

bool PageManager::canStep(SequenceAppend const* appends, int32_t count) const
{
    State const& s = *mState;
    s.checkStep(appends, count);
    s.countStep(appends, count, s.stepNeeded.data(), s.stepReleased.data());
    for (int32_t g = 0; g < s.numGroups(); ++g)
    {
        size_t const i = static_cast<size_t>(g);
        if (s.stepNeeded[i] > s.pools[i].available() + s.stepReleased[i])
        {
            return false;
        }
    }
    return true;
}

StepCopies PageManager::lastCopies() const noexcept
{
    return StepCopies(mState->copies.data(), mState->numGroups(), &mState->stateCopies);
}

int32_t PageManager::hashNextPages(SequenceId sequence, int32_t const* tokens, int32_t count, PageHash* out,
    PageExtraKey const* extraKeys, int32_t numExtraKeys) const
{
    return mState->hashNextPages(
        mState->sequences.rowOf(sequence, "hashNextPages"), tokens, count, out, extraKeys, numExtraKeys);
}

SequenceId PageManager::fork(SequenceId parent)
{
    State& s = *mState;
    int32_t const parentRow = s.sequences.rowOf(parent, "fork");
    // The copies that can throw come before the row is taken, so a failed fork changes nothing.
    std::vector<int32_t> firstHeld = s.sequences[parentRow].firstHeld;
    auto pendingKeys = s.sequences[parentRow].pendingKeys;
    std::vector<uint8_t> salt;
    if (s.recordsEvents())
    {
        salt = s.sequences[parentRow].salt;
    }
    int32_t const row = s.sequences.take("fork");
    SequenceState const& from = s.sequences[parentRow];
    SequenceState& to = s.sequences[row];
    to.length = from.length;
    to.root = from.root;
    to.tenant = from.tenant;
    to.lastHash = from.lastHash;
    to.firstHeld = std::move(firstHeld);
    to.pendingKeys = std::move(pendingKeys);
    if (s.recordsEvents())
    {
        to.salt.swap(salt);
    }
    to.promptBoundary = from.promptBoundary;
    to.matchBoundary = from.matchBoundary;
    std::memcpy(s.sequences.partial(row), s.sequences.partial(parentRow),
        static_cast<size_t>(s.tokensPerPage) * sizeof(int32_t));
    int32_t const numEntries = static_cast<int32_t>(s.pagesFor(from.length));
    if (s.sequences.keepsHashes())
    {
        PageHash const* hashes = s.sequences.hashes(parentRow);
        std::copy(hashes, hashes + (from.length >> s.pageShift), s.sequences.hashes(row));
    }
    for (int32_t g = 0; g < s.numGroups(); ++g)
    {
        PagePool& pool = s.pools[static_cast<size_t>(g)];
        int32_t const* source = s.sequences.entries(g, parentRow);
        int32_t* target = s.sequences.entries(g, row);
        std::copy(source, source + numEntries, target);
        for (int32_t e = from.firstHeld[static_cast<size_t>(g)]; e < numEntries; ++e)
        {
            pool.hold(target[e]);
        }
    }
    if (s.stateSlots)
    {
        s.queueForkCopy(parentRow, row);
    }
    return s.sequences.idOf(row);
}

void PageManager::free(SequenceId id)
{
    State& s = *mState;
    int32_t const row = s.sequences.rowOf(id, "free");
    SequenceState const& sequence = s.sequences[row];
    int32_t const numEntries = static_cast<int32_t>(s.pagesFor(sequence.length));
    // A later request may resume where this one stops (a conversation's next turn): cut at its whole pages, anchoring
    // the window pages it still holds before they are let go.
    if (s.cuts.enabled())
    {
        s.makeCut(row, sequence.length >> s.pageShift);
    }
    for (int32_t g = 0; g < s.numGroups(); ++g)
    {
        int32_t* entries = s.sequences.entries(g, row);
        for (int32_t e = numEntries - 1; e >= sequence.firstHeld[static_cast<size_t>(g)]; --e)
        {
            s.releasePage(g, entries[e]);
        }
        std::fill(entries, entries + numEntries, kUNUSED_PAGE_ENTRY);
    }
    s.sequences.release(row, s.stateSlots && s.freeState(row));
}

bool PageManager::contains(SequenceId sequence) const noexcept
{
    return mState->sequences.findRow(sequence) >= 0;
}

int32_t PageManager::length(SequenceId sequence) const
{
    return mState->sequences[mState->sequences.rowOf(sequence, "length")].length;
}

SequencePages PageManager::pages(SequenceId sequence, int32_t group) const
{
    State const& s = *mState;
    int32_t const row = s.sequences.rowOf(sequence, "pages");
    s.checkGroup(group, "pages");
    int32_t const length = s.sequences[row].length;
    return SequencePages{s.sequences.entries(group, row), static_cast<int32_t>(s.pagesFor(length)), length};
}

int32_t PageManager::evictCached(int32_t group, int32_t count)
{
    State& s = *mState;
    s.checkGroup(group, "evictCached");
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("PageManager::evictCached: count is {}; it must be >= 0", count));
    }
    PagePool& pool = s.pools[static_cast<size_t>(group)];
    if (s.recordsEvents())
    {
        s.events.reserveMore(1, static_cast<size_t>(std::min(count, pool.numCached())), 0, 0);
    }
    s.expireRetention();
    int32_t evicted = 0;
    while (evicted < count && pool.numCached() > 0)
    {
        pool.pages.freeKept(s.evictOne(group));
        ++evicted;
    }
    s.prefix.notifyEvictions();
    return evicted;
}

void PageManager::setEvictionCallback(EvictionCallback callback)
{
    mState->prefix.setCallback(std::move(callback));
}

PageGroupCounts PageManager::counts(int32_t group) const
{
    mState->checkGroup(group, "counts");
    PagePool const& pool = mState->pools[static_cast<size_t>(group)];
    PageGroupCounts result;
    result.numPages = pool.pages.numPages();
    result.free = pool.pages.numFree();
    result.cached = pool.numCached();
    result.anchored = pool.numAnchoredCached;
    result.used = pool.pages.numUsed();
    result.shared = pool.numShared;
    return result;
}

void PageManager::checkInvariants() const
{
    mState->checkInvariants();
}

int32_t PageManager::numGroups() const noexcept
{
    return mState->numGroups();
}

KVCacheLayout const& PageManager::layout() const noexcept
{
    return mState->layout;
}

int32_t PageManager::maxSequences() const noexcept
{
    return mState->sequences.maxSequences();
}

int32_t PageManager::numSequences() const noexcept
{
    return mState->sequences.numSequences();
}

PageHasher const& PageManager::hasher() const noexcept
{
    return mState->prefix.hasher();
}

} // namespace kvcache::rt
