#pragma once

// The lists a page kernel walks: a host list carried in the kernel's parameters, or a list in device memory whose
// length the device reads. Items are small structs of 4-byte ids (page ids, copy pairs, host tier entries).

#include "device/cache_hints.cuh"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kvcache::rt::detail
{

//! Reads one list item, one 4-byte word at a time through loadWord (the lists are read-only while a kernel runs).
template <typename Item>
__device__ __forceinline__ Item loadItem(Item const* item)
{
    static_assert(std::is_trivially_copyable_v<Item> && sizeof(Item) % sizeof(int32_t) == 0);
    constexpr int32_t kWORDS = sizeof(Item) / sizeof(int32_t);
    int32_t words[kWORDS];
#pragma unroll
    for (int32_t k = 0; k < kWORDS; ++k)
    {
        words[k] = loadWord(reinterpret_cast<int32_t const*>(item) + k);
    }
    Item value;
    memcpy(&value, words, sizeof(Item));
    return value;
}

//! A list of at most N items that travels as kernel parameters: graph-safe, since a graph keeps the values.
template <typename Item, int32_t N>
struct InlineList
{
    Item items[N];
    int32_t count;

    __device__ int32_t size() const
    {
        return count;
    }
    __device__ Item operator[](int32_t i) const
    {
        return items[i];
    }
};

//! Returns the inline list of `items[0, count)`; `count` must be at most N (the caller splits longer lists).
template <int32_t N, typename Item>
InlineList<Item, N> makeInlineList(Item const* items, int32_t count)
{
    InlineList<Item, N> list;
    list.count = count;
    std::copy(items, items + count, list.items);
    return list;
}

//! Positions [first, first + capacity) of a list in device memory, for a launch over that part of it. The whole
//! list's length is read on the device, so a graph replay may change it.
template <typename Item>
struct DeviceList
{
    Item const* items;    //!< the list's position `first`
    int32_t const* count; //!< the whole list's length (null: every position is listed)
    int32_t first;
    int32_t capacity; //!< positions of this part: the grid never reads past them

    //! Returns the listed positions of this part: the whole list's count less `first`, within [0, capacity].
    __device__ int32_t size() const
    {
        return count == nullptr ? capacity : min(max(loadWord(count) - first, 0), capacity);
    }
    //! `i` must be below capacity (the grid guarantees it), so the read stays inside the caller's list.
    __device__ Item operator[](int32_t i) const
    {
        return loadItem(&items[i]);
    }
};

} // namespace kvcache::rt::detail
