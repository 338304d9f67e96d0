#pragma once

#include "kvcache/memory/page_ops.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Checks a host copy list before anything is launched: throws InvalidArgumentError for a negative count or a null
//! list with a positive count, OutOfRangeError for an id outside [0, numPages), and InvalidArgumentError for a
//! destination listed twice or a page that is both a source and a destination. Messages start with `what`.
//! Linear time; allocates nothing for lists of up to kMAX_INLINE_PAGE_OPS entries.
void validateCopyList(char const* what, PageCopy const* pairs, int32_t count, int32_t numPages);

//! Checks a host reset list as validateCopyList does: count, null list, ids in range, no page listed twice.
void validateResetList(char const* what, int32_t const* pages, int32_t count, int32_t numPages);

//! Checks a device list's host-side arguments: throws InvalidArgumentError for a negative capacity or a null list with
//! a positive capacity.
void validateDeviceListArguments(char const* what, void const* list, int32_t capacity);

} // namespace kvcache::rt::detail
