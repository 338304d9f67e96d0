#pragma once

// A host tier's free host pages: a PageAllocator over every host page the tier is sized for, handing out only pinned
// ones.

#include "kvcache/paging/page_allocator.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! Throws OutOfRangeError naming `what`, the host page and [0, limit) (with `numPinned` of `numHostPages` pinned) when
//! `hostPage` is outside [0, limit).
void checkHostPage(char const* what, int64_t hostPage, int64_t limit, int64_t numPinned, int64_t numHostPages);

//! What a pool's messages call its calls and its ids.
struct HostPoolNames
{
    char const* allocate = "allocateHostPages";
    char const* release = "releaseHostPages";
    char const* noun = "host page";
    char const* plural = "host pages";
    char const* list = "hostPages";
};

//! Which host pages are handed out. Released host pages are handed out first, the most recently released first, then
//! never used ones in ascending order: the allocator's free list, whose never used ids lie below the released ones
//! in ascending order from the top, so host pages not yet pinned (the highest ids) come last and are never reached
//! while fewer than numFree(numPinned) are asked for.
class HostPagePool
{
public:
    //! A pool of `numHostPages` (in [1, INT32_MAX]) free host pages, named `names` in its messages.
    explicit HostPagePool(int64_t numHostPages, HostPoolNames names = HostPoolNames());

    //! Hands out `count` free host pages among the first `numPinned`. Throws InvalidArgumentError for a negative count
    //! and OutOfMemoryError naming the count and the free host pages when too few are free (nothing handed out).
    std::vector<int32_t> allocate(int32_t count, int64_t numPinned);
    //! Returns handed-out host pages to the free list, in order. Throws OutOfRangeError for a host page outside
    //! [0, numPinned) and InvalidArgumentError for one not handed out or listed twice, before releasing any.
    void release(int32_t const* hostPages, int32_t count, int64_t numPinned);
    //! Returns the host pages neither handed out nor beyond `numPinned`.
    int64_t numFree(int64_t numPinned) const noexcept
    {
        return int64_t{mAllocator.numFree()} - (int64_t{mAllocator.numPages()} - numPinned);
    }

private:
    PageAllocator mAllocator;
    HostPoolNames mNames;
};

} // namespace kvcache::rt::detail
