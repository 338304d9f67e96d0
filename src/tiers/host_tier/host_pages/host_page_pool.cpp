#include "tiers/host_tier/host_pages/host_page_pool.h"

#include "memory/page_ops/page_list_validation.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvcache::rt::detail
{

void checkHostPage(char const* what, int64_t hostPage, int64_t limit, int64_t numPinned, int64_t numHostPages)
{
    if (hostPage < 0 || hostPage >= limit)
    {
        throw OutOfRangeError(fmt::format("{}: host page {} is outside [0, {}) ({} of {} host pages pinned)", what,
            hostPage, limit, numPinned, numHostPages));
    }
}

HostPagePool::HostPagePool(int64_t numHostPages, HostPoolNames names)
    : mAllocator(static_cast<int32_t>(numHostPages))
    , mNames(names)
{
}

std::vector<int32_t> HostPagePool::allocate(int32_t count, int64_t numPinned)
{
    char const* const kWHAT = mNames.allocate;
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: count is {}; it must be >= 0", kWHAT, count));
    }
    int64_t const available = numFree(numPinned);
    if (count > available)
    {
        throw OutOfMemoryError(fmt::format("{}: count is {}; the tier has {} free {} ({} of {} pinned)", kWHAT, count,
            available, mNames.plural, numPinned, mAllocator.numPages()));
    }
    std::vector<int32_t> hostPages(static_cast<size_t>(count));
    mAllocator.allocate(count, hostPages.data());
    return hostPages;
}

void HostPagePool::release(int32_t const* hostPages, int32_t count, int64_t numPinned)
{
    char const* const kWHAT = mNames.release;
    if (count < 0 || (hostPages == nullptr && count > 0))
    {
        throw InvalidArgumentError(fmt::format("{}: count is {} with a {} list; it must be >= 0 with a list", kWHAT,
            count, hostPages == nullptr ? "null" : "non-null"));
    }
    for (int32_t i = 0; i < count; ++i)
    {
        if (hostPages[i] < 0 || hostPages[i] >= numPinned)
        {
            throw OutOfRangeError(fmt::format("{}: {} {} is outside [0, {}) ({} of {} {} pinned)", kWHAT, mNames.noun,
                hostPages[i], numPinned, numPinned, mAllocator.numPages(), mNames.plural));
        }
        if (mAllocator.refCount(hostPages[i]) == 0)
        {
            throw InvalidArgumentError(fmt::format(
                "{}: {}[{}] is {} {}, which is not handed out", kWHAT, mNames.list, i, mNames.noun, hostPages[i]));
        }
    }
    std::vector<int32_t> sorted(hostPages, hostPages + count);
    validateDistinctIds(kWHAT, mNames.noun, sorted);
    mAllocator.release(hostPages, count);
}

} // namespace kvcache::rt::detail
