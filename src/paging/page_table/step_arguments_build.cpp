// Step argument building on the host (step_arguments_build.h): the checks, the token positions and qoIndptr, and each
// group's tables through buildPageTables. No CUDA calls, so host tests drive every path.

#include "paging/page_table/step_arguments_build.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvcache::rt::detail
{
namespace
{

static_assert(sizeof(TokenPosition) == 2 * sizeof(int32_t) && alignof(TokenPosition) == alignof(int32_t),
    "a TokenPosition is two int32 in the region");

//! The row writeTokens skips.
constexpr TokenPosition kPADDING_POSITION{-1, 0};
//! The state slot of a row past the step's entries, and of every row without state layers: a kernel skips it.
constexpr int32_t kPADDING_STATE_SLOT = -1;

void checkPositive(char const* field, int32_t value)
{
    if (value <= 0)
    {
        throw InvalidArgumentError(fmt::format("StepArgumentBuffers: {} is {}; it must be > 0", field, value));
    }
}

TokenPosition* positionsOf(StepArgumentShape const& shape, int32_t* region) noexcept
{
    return reinterpret_cast<TokenPosition*>(region + shape.positionsOffset());
}

//! Throws unless `manager` has the groups the arguments were sized for.
void checkGroups(StepArgumentShape const& shape, PageManager const& manager)
{
    KVCacheLayout const& layout = manager.layout();
    if (manager.numGroups() != shape.numGroups())
    {
        throw InvalidArgumentError(fmt::format("{}: the manager has {} page groups; the arguments were sized for {}",
            kSTEP_BUILD, manager.numGroups(), shape.numGroups()));
    }
    if (layout.tokensPerPage != shape.tokensPerPage)
    {
        throw InvalidArgumentError(fmt::format("{}: the manager's tokensPerPage is {}; the arguments were sized for {}",
            kSTEP_BUILD, layout.tokensPerPage, shape.tokensPerPage));
    }
    for (int32_t g = 0; g < shape.numGroups(); ++g)
    {
        int32_t const width = layout.groups[static_cast<size_t>(g)].pagesPerSequence;
        if (width != shape.groups[static_cast<size_t>(g)].maxPagesPerSequence)
        {
            throw InvalidArgumentError(
                fmt::format("{}: the manager's group {} pagesPerSequence is {}; the arguments were sized for {}",
                    kSTEP_BUILD, g, width, shape.groups[static_cast<size_t>(g)].maxPagesPerSequence));
        }
    }
}

//! Throws unless the entries make a step of `shape` for `manager`; returns their tokens. Touches nothing of the
//! region; leaves each entry's group 0 page list and length in `scratch`.
int64_t checkEntries(StepArgumentShape const& shape, PageManager const& manager, SequenceAppend const* entries,
    int32_t count, StepScratch& scratch)
{
    if (count < 0 || count > shape.maxBatchSize)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: count is {}; it must be in [0, {}] (maxBatchSize)", kSTEP_BUILD, count, shape.maxBatchSize));
    }
    if (count > 0 && entries == nullptr)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: entries is null with count {}; it must point to {} SequenceAppend", kSTEP_BUILD, count, count));
    }
    checkGroups(shape, manager);
    scratch.pages.resize(static_cast<size_t>(count));
    scratch.lengths.resize(static_cast<size_t>(count));
    int64_t tokens = 0;
    for (int32_t b = 0; b < count; ++b)
    {
        SequenceAppend const& entry = entries[b];
        if (!manager.contains(entry.sequence))
        {
            throw InvalidArgumentError(fmt::format("{}: entries[{}].sequence is {}; the manager holds no such sequence "
                                                   "(never created or freed)",
                kSTEP_BUILD, b, entry.sequence));
        }
        // Group 0's list gives the length too, and is the first group's list to build.
        SequencePages const pages = manager.pages(entry.sequence, 0);
        scratch.pages[static_cast<size_t>(b)] = pages;
        scratch.lengths[static_cast<size_t>(b)] = pages.numTokens;
        int32_t const length = pages.numTokens;
        if (entry.count < 0 || entry.count > length)
        {
            throw InvalidArgumentError(fmt::format("{}: entries[{}].count is {}; it must be in [0, {}] (the length of "
                                                   "sequence {}, whose last tokens the step appended)",
                kSTEP_BUILD, b, entry.count, length, entry.sequence));
        }
        tokens += entry.count;
    }
    if (tokens > shape.maxTokensPerStep)
    {
        throw InvalidArgumentError(fmt::format("{}: the entries' counts add up to {} tokens; they must be at most {} "
                                               "(maxTokensPerStep)",
            kSTEP_BUILD, tokens, shape.maxTokensPerStep));
    }
    return tokens;
}

} // namespace

StepArgumentShape makeStepArgumentShape(PageManager const& manager, int32_t maxBatchSize, int32_t maxTokensPerStep)
{
    checkPositive("maxBatchSize", maxBatchSize);
    checkPositive("maxTokensPerStep", maxTokensPerStep);
    KVCacheLayout const& layout = manager.layout();
    StepArgumentShape shape;
    shape.maxBatchSize = maxBatchSize;
    shape.maxTokensPerStep = maxTokensPerStep;
    shape.tokensPerPage = layout.tokensPerPage;
    int64_t offset = shape.positionsOffset() + alignedElements(2 * int64_t{maxTokensPerStep});
    for (KVPageGroupLayout const& group : layout.groups)
    {
        shape.groups.push_back(makePageTableShape(maxBatchSize, group.pagesPerSequence, layout.tokensPerPage));
        shape.groupOffsets.push_back(offset);
        offset += shape.groups.back().elements();
    }
    shape.groupOffsets.push_back(offset);
    return shape;
}

void writeEmptyStepArguments(StepArgumentShape const& shape, int32_t* region) noexcept
{
    std::fill(region, region + shape.groupOffsets.front(), 0);
    int32_t* const stateSlots = region + shape.stateSlotsOffset();
    std::fill(stateSlots, stateSlots + shape.maxBatchSize, kPADDING_STATE_SLOT);
    TokenPosition* const positions = positionsOf(shape, region);
    std::fill(positions, positions + shape.maxTokensPerStep, kPADDING_POSITION);
    for (int32_t g = 0; g < shape.numGroups(); ++g)
    {
        writeEmptyPageTables(shape.groups[static_cast<size_t>(g)], region + shape.groupOffsets[static_cast<size_t>(g)]);
    }
}

int64_t buildStepArguments(StepArgumentShape const& shape, PageManager const& manager, SequenceAppend const* entries,
    int32_t count, int32_t* region, StepScratch& scratch)
{
    int64_t const tokens = checkEntries(shape, manager, entries, count, scratch);
    // The groups first: their page lists come from the manager, which keeps them within the tables' rules.
    int64_t elements = shape.groupOffsets.front();
    for (int32_t g = 0; g < shape.numGroups(); ++g)
    {
        for (int32_t b = 0; g > 0 && b < count; ++b)
        {
            scratch.pages[static_cast<size_t>(b)] = manager.pages(entries[b].sequence, g);
        }
        int64_t const offset = shape.groupOffsets[static_cast<size_t>(g)];
        elements = offset
            + buildPageTables(shape.groups[static_cast<size_t>(g)], scratch.pages.data(), count, region + offset);
    }
    // Positions: the rows this region's previous build used past this step's tokens go back to padding, so the rows
    // from the token count on are padding without rewriting them all.
    int32_t* const tokenCount = region + shape.tokenCountOffset();
    int32_t* const qoIndptr = region + shape.qoIndptrOffset();
    TokenPosition* const positions = positionsOf(shape, region);
    int64_t const previousTokens = *tokenCount;
    int64_t row = 0;
    qoIndptr[0] = 0;
    for (int32_t b = 0; b < count; ++b)
    {
        int32_t const appended = entries[b].count;
        int32_t const first = scratch.lengths[static_cast<size_t>(b)] - appended;
        for (int32_t t = 0; t < appended; ++t)
        {
            positions[row + t] = TokenPosition{b, first + t};
        }
        row += appended;
        // At most maxTokensPerStep, an int32.
        qoIndptr[b + 1] = static_cast<int32_t>(row);
    }
    std::fill(qoIndptr + count + 1, qoIndptr + shape.maxBatchSize + 1, static_cast<int32_t>(tokens));
    // Like qoIndptr, written whole (maxBatchSize entries): no record of the rows the previous build used is needed.
    // stateSlot() cannot throw here: checkEntries found every sequence.
    int32_t* const stateSlots = region + shape.stateSlotsOffset();
    for (int32_t b = 0; b < count; ++b)
    {
        stateSlots[b] = manager.stateSlot(entries[b].sequence);
    }
    std::fill(stateSlots + count, stateSlots + shape.maxBatchSize, kPADDING_STATE_SLOT);
    if (previousTokens > tokens)
    {
        std::fill(positions + tokens, positions + previousTokens, kPADDING_POSITION);
    }
    *tokenCount = static_cast<int32_t>(tokens);
    return elements;
}

} // namespace kvcache::rt::detail
