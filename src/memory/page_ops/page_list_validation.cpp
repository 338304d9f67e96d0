#include "memory/page_ops/page_list_validation.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace kvcache::rt::detail
{
namespace
{

void checkLength(char const* what, char const* noun, void const* list, int32_t count)
{
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: {} is {}; it must be >= 0", what, noun, count));
    }
    if (list == nullptr && count > 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the list is null but {} is {}", what, noun, count));
    }
}

void checkId(char const* what, char const* field, int32_t index, int32_t id, int32_t numPages)
{
    if (id < 0 || id >= numPages)
    {
        throw OutOfRangeError(
            fmt::format("{}: {}[{}] is page {}; page ids must be in [0, {})", what, field, index, id, numPages));
    }
}

//! Rejects a page written twice in one call, and (for copies) a page that is both read and written. `writtenAt(i)`
//! and `readAt(i)` return the i-th written and read page ids, already checked to be in range. A repeated written id
//! is reported as "<noun> <id> <repeated>".
template <typename WrittenAt, typename ReadAt>
void checkDisjoint(char const* what, int32_t writtenCount, WrittenAt writtenAt, int32_t readCount, ReadAt readAt,
    char const* noun = "page", char const* repeated = "is a destination more than once")
{
    // An open-addressing set of the written ids, at most half full: linear time, where sorting the list cost more
    // than the launch itself. Lists up to one launch's size use a stack table, so the common call allocates nothing.
    constexpr int32_t kLOCAL_SLOTS = 2 * kMAX_INLINE_PAGE_OPS;
    constexpr int32_t kEMPTY = -1;
    std::array<int32_t, kLOCAL_SLOTS> local;
    thread_local std::vector<int32_t> large;
    uint32_t slotBits = 1;
    while ((int64_t{1} << slotBits) < 2 * int64_t{writtenCount})
    {
        ++slotBits;
    }
    size_t const slots = size_t{1} << slotBits;
    if (slots > local.size())
    {
        large.resize(slots);
    }
    int32_t* const table = slots > local.size() ? large.data() : local.data();
    std::fill(table, table + slots, kEMPTY);
    auto const slotOf = [slotBits](int32_t id) { return (static_cast<uint32_t>(id) * 2654435761U) >> (32 - slotBits); };
    size_t const mask = slots - 1;
    // The slot holding `id`, or the empty slot where it would go.
    auto const probe = [&](int32_t id)
    {
        size_t slot = slotOf(id);
        while (table[slot] != kEMPTY && table[slot] != id)
        {
            slot = (slot + 1) & mask;
        }
        return slot;
    };

    for (int32_t i = 0; i < writtenCount; ++i)
    {
        int32_t const id = writtenAt(i);
        size_t const slot = probe(id);
        if (table[slot] == id)
        {
            throw InvalidArgumentError(fmt::format("{}: {} {} {}", what, noun, id, repeated));
        }
        table[slot] = id;
    }
    for (int32_t i = 0; i < readCount; ++i)
    {
        int32_t const id = readAt(i);
        if (table[probe(id)] == id)
        {
            throw InvalidArgumentError(
                fmt::format("{}: {} {} is both a source and a destination in one call", what, noun, id));
        }
    }
}

} // namespace

void validateCopyList(char const* what, PageCopy const* pairs, int32_t count, int32_t numPages)
{
    checkLength(what, "count", pairs, count);
    for (int32_t i = 0; i < count; ++i)
    {
        checkId(what, "pairs.src", i, pairs[i].src, numPages);
        checkId(what, "pairs.dst", i, pairs[i].dst, numPages);
    }
    checkDisjoint(
        what, count, [pairs](int32_t i) { return pairs[i].dst; }, count, [pairs](int32_t i) { return pairs[i].src; });
}

void validateStateCopyList(char const* what, StateSlotCopy const* copies, int32_t count, int32_t numStateSlots)
{
    checkLength(what, "count", copies, count);
    if (count > 0 && numStateSlots == 0)
    {
        throw InvalidArgumentError(
            fmt::format("{}: count is {} but the cache has no state layers (KVCacheConfig::stateLayerConfigs is empty)",
                what, count));
    }
    for (int32_t i = 0; i < count; ++i)
    {
        for (auto const& [field, slot] : {std::pair{"src", copies[i].src}, std::pair{"dst", copies[i].dst}})
        {
            if (slot < 0 || slot >= numStateSlots)
            {
                throw OutOfRangeError(fmt::format("{}: copies[{}].{} is slot {}; state slots must be in [0, {}) "
                                                  "(numStateSlots)",
                    what, i, field, slot, numStateSlots));
            }
        }
    }
    checkDisjoint(
        what, count, [copies](int32_t i) { return copies[i].dst; }, count,
        [copies](int32_t i) { return copies[i].src; }, "slot");
}

void validateResetList(char const* what, int32_t const* pages, int32_t count, int32_t numPages)
{
    checkLength(what, "count", pages, count);
    for (int32_t i = 0; i < count; ++i)
    {
        checkId(what, "pages", i, pages[i], numPages);
    }
    checkDisjoint(
        what, count, [pages](int32_t i) { return pages[i]; }, 0, [](int32_t) { return 0; });
}

void validateDeviceListArguments(char const* what, void const* list, int32_t capacity)
{
    checkLength(what, "capacity", list, capacity);
}

void validateHostTierEntries(char const* what, HostTierEntry const* entries, int32_t count, int32_t numPages,
    int64_t numHostPages, std::string_view hostPageNote)
{
    checkLength(what, "count", entries, count);
    for (int32_t i = 0; i < count; ++i)
    {
        if (entries[i].page < 0 || entries[i].page >= numPages)
        {
            throw OutOfRangeError(fmt::format(
                "{}: entries[{}].page is page {}; page ids must be in [0, {})", what, i, entries[i].page, numPages));
        }
        if (entries[i].hostPage < 0 || entries[i].hostPage >= numHostPages)
        {
            throw OutOfRangeError(
                fmt::format("{}: entries[{}].hostPage is host page {}; host pages must be in [0, {}){}{}", what, i,
                    entries[i].hostPage, numHostPages, hostPageNote.empty() ? "" : " ", hostPageNote));
        }
    }
    auto const pageAt = [entries](int32_t i) { return entries[i].page; };
    auto const hostPageAt = [entries](int32_t i) { return entries[i].hostPage; };
    auto const nothing = [](int32_t) { return 0; };
    checkDisjoint(what, count, pageAt, 0, nothing, "page", "is listed more than once");
    checkDisjoint(what, count, hostPageAt, 0, nothing, "host page", "is listed more than once");
}

void validateDistinctIds(char const* what, char const* noun, std::vector<int32_t>& ids)
{
    std::sort(ids.begin(), ids.end());
    auto const repeated = std::adjacent_find(ids.begin(), ids.end());
    if (repeated != ids.end())
    {
        throw InvalidArgumentError(fmt::format("{}: {} {} is listed more than once", what, noun, *repeated));
    }
}

} // namespace kvcache::rt::detail
