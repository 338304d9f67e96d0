#pragma once

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

namespace kvcache::rt::detail
{

//! Returns `list.size()` as int32, or throws InvalidArgumentError naming `what`.
template <typename Item>
int32_t listCount(char const* what, std::vector<Item> const& list)
{
    if (list.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the list has {} entries; the limit is {}", what, list.size(), std::numeric_limits<int32_t>::max()));
    }
    return static_cast<int32_t>(list.size());
}

//! Checks a host copy list before anything is launched: throws InvalidArgumentError for a negative count or a null
//! list with a positive count, OutOfRangeError for an id outside [0, numPages), and InvalidArgumentError for a
//! destination listed twice or a page that is both a source and a destination. Messages start with `what`.
//! Linear time; allocates nothing for lists of up to kMAX_INLINE_PAGE_OPS entries.
void validateCopyList(char const* what, PageCopy const* pairs, int32_t count, int32_t numPages);

//! Checks a host state copy list as validateCopyList does a page copy list, slots in [0, numStateSlots) for page ids
//! (OutOfRangeError naming copies[i].src or .dst), and throws InvalidArgumentError for a positive count when
//! numStateSlots is 0 (a cache without state layers).
void validateStateCopyList(char const* what, StateSlotCopy const* copies, int32_t count, int32_t numStateSlots);

//! Checks a host reset list as validateCopyList does: count, null list, ids in range, no page listed twice.
void validateResetList(char const* what, int32_t const* pages, int32_t count, int32_t numPages);

//! Checks a device list's host-side arguments: throws InvalidArgumentError for a negative capacity or a null list with
//! a positive capacity.
void validateDeviceListArguments(char const* what, void const* list, int32_t capacity);

//! Checks a host tier transfer list before anything is enqueued: throws InvalidArgumentError for a negative count or a
//! null list with a positive count; OutOfRangeError for an entries[i].page outside [0, numPages) or an
//! entries[i].hostPage outside [0, numHostPages) (its message ends with `hostPageNote`, when not empty, to say where
//! numHostPages comes from); and InvalidArgumentError for a page or a host page listed twice. Checks entry by entry,
//! page before host page, then repeats. Messages start with `what`. Linear time; allocates nothing for lists of up to
//! kMAX_INLINE_PAGE_OPS entries.
void validateHostTierEntries(char const* what, HostTierEntry const* entries, int32_t count, int32_t numPages,
    int64_t numHostPages, std::string_view hostPageNote = {});

//! Throws InvalidArgumentError naming `what`, `noun` and the smallest id listed more than once in `ids` (whose order
//! it changes: sorted in place). For lists whose range is checked elsewhere (host pages of a release or a file).
void validateDistinctIds(char const* what, char const* noun, std::vector<int32_t>& ids);

} // namespace kvcache::rt::detail
