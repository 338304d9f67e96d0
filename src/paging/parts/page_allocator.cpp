#include "kvcache/paging/page_allocator.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace kvcache::rt
{

PageAllocator::PageAllocator(int32_t numPages)
{
    if (numPages < 0 || numPages > kMAX_NUM_PAGES)
    {
        throw InvalidArgumentError(fmt::format(
            "PageAllocator: numPages is {}; it must be in [0, {}] (kMAX_NUM_PAGES)", numPages, kMAX_NUM_PAGES));
    }
    size_t const size = static_cast<size_t>(numPages);
    mRefCounts.assign(size, 0);
    mFreeStack.resize(size);
    // The top of the stack is the end: page 0 there, so a new allocator hands out 0, 1, 2, ...
    for (size_t i = 0; i < size; ++i)
    {
        mFreeStack[i] = static_cast<int32_t>(size - 1 - i);
    }
    mNumFree = numPages;
}

PageAllocator::PageAllocator(PageAllocator&& other) noexcept
    : mRefCounts(std::move(other.mRefCounts))
    , mFreeStack(std::move(other.mFreeStack))
    , mNumFree(std::exchange(other.mNumFree, 0))
    , mNumKept(std::exchange(other.mNumKept, 0))
{
}

PageAllocator& PageAllocator::operator=(PageAllocator&& other) noexcept
{
    if (this != &other)
    {
        mRefCounts = std::move(other.mRefCounts);
        mFreeStack = std::move(other.mFreeStack);
        mNumFree = std::exchange(other.mNumFree, 0);
        mNumKept = std::exchange(other.mNumKept, 0);
        // A moved-from vector is only "valid": make the source's no pages explicit.
        other.mRefCounts.clear();
        other.mFreeStack.clear();
    }
    return *this;
}

void PageAllocator::failAllocate(int32_t count, bool nullList) const
{
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("PageAllocator::allocate: count is {}; it must be >= 0", count));
    }
    if (nullList && count > 0)
    {
        throw InvalidArgumentError(fmt::format("PageAllocator::allocate: the list is null but count is {}", count));
    }
    throw OutOfMemoryError(fmt::format(
        "PageAllocator::allocate: {} needed, {} free of {} pages; nothing allocated", count, mNumFree, numPages()));
}

void PageAllocator::failIndex(char const* what, int32_t page) const
{
    throw OutOfRangeError(
        fmt::format("{}: page {} is out of range; page ids must be in [0, {})", what, page, numPages()));
}

void PageAllocator::failRetain(int32_t page) const
{
    char const* const what = "PageAllocator::retain";
    if (!inRange(page))
    {
        failIndex(what, page);
    }
    int32_t const count = mRefCounts[static_cast<size_t>(page)];
    if (count == 0)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: page {} is free (reference count 0); only a page in use (count >= 1) can be retained", what, page));
    }
    if (count == kKEPT)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: page {} is kept; only a page in use (count >= 1) can be retained (hold() takes a kept page)", what,
            page));
    }
    throw InvalidArgumentError(
        fmt::format("{}: page {} has reference count {}, the limit (kMAX_REF_COUNT)", what, page, count));
}

void PageAllocator::failRelease(int32_t page) const
{
    char const* const what = "PageAllocator::release";
    if (!inRange(page))
    {
        failIndex(what, page);
    }
    if (mRefCounts[static_cast<size_t>(page)] == kKEPT)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: page {} is kept (no holder); only a page in use (count >= 1) can be released", what, page));
    }
    throw InvalidArgumentError(fmt::format(
        "{}: page {} is free (reference count 0): a double free; only a page in use (count >= 1) can be released", what,
        page));
}

void PageAllocator::failFreeKept(int32_t page) const
{
    char const* const what = "PageAllocator::freeKept";
    if (!inRange(page))
    {
        failIndex(what, page);
    }
    throw InvalidArgumentError(fmt::format("{}: page {} is not kept (reference count {}); only a kept page can be "
                                           "freed this way",
        what, page, mRefCounts[static_cast<size_t>(page)]));
}

void PageAllocator::failReleaseList(int32_t const* pages, int32_t count, int32_t failed)
{
    char const* const what = "PageAllocator::release";
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: count is {}; it must be >= 0", what, count));
    }
    if (pages == nullptr && count > 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the list is null but count is {}", what, count));
    }
    // Undo pages[0, failed) newest first: a page whose count reached 0 was pushed last of those still on the stack.
    for (int32_t i = failed - 1; i >= 0; --i)
    {
        size_t const page = static_cast<size_t>(pages[i]);
        if (mRefCounts[page] == 0) // pushed on the free stack by this call: take it off again
        {
            --mNumFree;
        }
        ++mRefCounts[page];
    }
    int32_t const page = pages[failed];
    if (!inRange(page))
    {
        throw OutOfRangeError(fmt::format("{}: pages[{}] is page {}, out of range; page ids must be in [0, {}); "
                                          "nothing released",
            what, failed, page, numPages()));
    }
    int32_t const refCount = mRefCounts[static_cast<size_t>(page)];
    if (refCount == kKEPT)
    {
        throw InvalidArgumentError(
            fmt::format("{}: pages[{}] is page {}, kept (no holder); nothing released", what, failed, page));
    }
    if (refCount == 0)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: pages[{}] is page {}, free (reference count 0): a double free; nothing released", what, failed, page));
    }
    int64_t listed = 0;
    for (int32_t i = 0; i <= failed; ++i)
    {
        listed += pages[i] == page ? 1 : 0;
    }
    throw InvalidArgumentError(
        fmt::format("{}: pages[{}] is page {}, listed {} times in pages[0, {}] but its reference "
                    "count is {}; nothing released",
            what, failed, page, listed, failed, refCount));
}

void PageAllocator::checkInvariants() const
{
    char const* const what = "PageAllocator::checkInvariants";
    int32_t const pageCount = numPages();
    if (mFreeStack.size() != mRefCounts.size())
    {
        throw std::logic_error(
            fmt::format("{}: the free list holds {} entries for {} pages", what, mFreeStack.size(), mRefCounts.size()));
    }
    if (mNumFree < 0 || mNumFree > pageCount)
    {
        throw std::logic_error(fmt::format("{}: numFree is {}; it must be in [0, {}]", what, mNumFree, pageCount));
    }
    std::vector<bool> listed(mRefCounts.size(), false);
    for (int32_t i = 0; i < mNumFree; ++i)
    {
        int32_t const page = mFreeStack[static_cast<size_t>(i)];
        if (!inRange(page))
        {
            throw std::logic_error(
                fmt::format("{}: free list entry {} is page {}, outside [0, {})", what, i, page, pageCount));
        }
        if (listed[static_cast<size_t>(page)])
        {
            throw std::logic_error(
                fmt::format("{}: free list entry {} is page {}, which appears in the list twice", what, i, page));
        }
        listed[static_cast<size_t>(page)] = true;
        if (mRefCounts[static_cast<size_t>(page)] != 0)
        {
            throw std::logic_error(fmt::format("{}: free list entry {} is page {}, whose reference count is {} (not 0)",
                what, i, page, mRefCounts[static_cast<size_t>(page)]));
        }
    }
    int64_t used = 0;
    int64_t kept = 0;
    for (int32_t page = 0; page < pageCount; ++page)
    {
        int32_t const count = mRefCounts[static_cast<size_t>(page)];
        if (count == kKEPT)
        {
            ++kept;
            continue;
        }
        if (count < 0)
        {
            throw std::logic_error(fmt::format("{}: page {} has reference count {} (< 0)", what, page, count));
        }
        if (count == 0 && !listed[static_cast<size_t>(page)])
        {
            throw std::logic_error(
                fmt::format("{}: page {} has reference count 0 but is not in the free list", what, page));
        }
        used += count > 0 ? 1 : 0;
    }
    if (kept != mNumKept)
    {
        throw std::logic_error(fmt::format("{}: {} pages are kept, counted {}", what, kept, mNumKept));
    }
    if (mNumFree + used + kept != pageCount)
    {
        throw std::logic_error(fmt::format(
            "{}: numFree {} + {} pages in use + {} kept != numPages {}", what, mNumFree, used, kept, pageCount));
    }
}

} // namespace kvcache::rt
