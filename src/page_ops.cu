#include "kvcache/page_ops.h"

#include "layer_table_upload.h"

#include "kvcache/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvcache::rt
{
namespace detail
{
namespace
{

// One block moves one 32 KiB chunk of one page of one half of one layer, all its loads issued before its stores.
constexpr int64_t kVECTOR_BYTES = 16;
constexpr int64_t kCHUNK_BYTES = 32 * 1024;
// Measured on an H200 (docs/benchmarks.md): wide blocks (1024 threads x 2 vectors) copy large lists about 2% faster
// than narrow ones (256 x 8); narrow blocks win on small lists, and wherever layers' page sizes differ, since the
// grid then holds blocks with nothing to do and a wide one holds half a multiprocessor while it starts and exits.
constexpr int32_t kWIDE_THREADS = 1024;
constexpr int32_t kNARROW_THREADS = 256;
constexpr int64_t kMAX_NARROW_BLOCKS = 4096;
constexpr int32_t kTABLE_ENTRIES_PER_UPLOAD = 64;
// Short host lists travel in a small parameter block: a launch copies its whole parameter block.
constexpr int32_t kSMALL_INLINE_LIST = 32;

//! What every page kernel needs besides its list: which layers and halves, and the id range.
struct PageOpParams
{
    LayerTableEntry const* table;
    int32_t firstLayer;
    int32_t halfCount; //!< 1 or 2
    int32_t firstHalf; //!< 0 for K, 1 for V
    int32_t chunksPerPage;
    int32_t numPages;
    uint32_t pattern;
    int32_t* errorCount;
};

struct CopyOp
{
    using Item = PageCopy;
};

struct ResetOp
{
    using Item = int32_t;
};

//! A list that travels as kernel parameters (host lists, graph-safe by value).
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

//! A list in device memory whose length a graph replay may change through `count`.
template <typename Item>
struct DeviceList
{
    Item const* items;
    int32_t const* count;
    int32_t capacity;

    __device__ int32_t size() const
    {
        return count == nullptr ? capacity : min(max(*count, 0), capacity);
    }
    __device__ Item operator[](int32_t i) const
    {
        return items[i];
    }
};

__device__ bool isValidPage(int32_t id, int32_t numPages)
{
    return id >= 0 && id < numPages;
}

template <int32_t THREADS>
__device__ void copyChunk(char const* __restrict__ src, char* __restrict__ dst, int64_t bytes, bool vectorised)
{
    constexpr int32_t kVECTORS_PER_THREAD = static_cast<int32_t>(kCHUNK_BYTES / kVECTOR_BYTES / THREADS);
    if (vectorised && bytes == kCHUNK_BYTES)
    {
        auto const* from = reinterpret_cast<int4 const*>(src);
        auto* to = reinterpret_cast<int4*>(dst);
        int4 staged[kVECTORS_PER_THREAD];
#pragma unroll
        for (int32_t k = 0; k < kVECTORS_PER_THREAD; ++k)
        {
            staged[k] = __ldcg(from + threadIdx.x + k * THREADS);
        }
#pragma unroll
        for (int32_t k = 0; k < kVECTORS_PER_THREAD; ++k)
        {
            __stcg(to + threadIdx.x + k * THREADS, staged[k]);
        }
    }
    else if (vectorised)
    {
        auto const* from = reinterpret_cast<int4 const*>(src);
        auto* to = reinterpret_cast<int4*>(dst);
        for (int64_t i = threadIdx.x; i < bytes / kVECTOR_BYTES; i += THREADS)
        {
            __stcg(to + i, __ldcg(from + i));
        }
    }
    else
    {
        for (int64_t i = threadIdx.x; i < bytes; i += THREADS)
        {
            dst[i] = src[i];
        }
    }
}

//! Fills `bytes` bytes at `dst`, which sit `offset` bytes into a page, with the page-aligned 4-byte pattern.
template <int32_t THREADS>
__device__ void fillChunk(char* dst, int64_t offset, int64_t bytes, bool vectorised, uint32_t pattern)
{
    if (vectorised)
    {
        auto const word = static_cast<int>(pattern);
        int4 const value = make_int4(word, word, word, word);
        auto* to = reinterpret_cast<int4*>(dst);
        for (int64_t i = threadIdx.x; i < bytes / kVECTOR_BYTES; i += THREADS)
        {
            __stcg(to + i, value);
        }
    }
    else
    {
        for (int64_t i = threadIdx.x; i < bytes; i += THREADS)
        {
            dst[i] = static_cast<char>(pattern >> (8 * ((offset + i) % 4)));
        }
    }
}

//! Grid: x = list position * chunksPerPage + chunk, y = targeted layer * halfCount + half.
template <int32_t THREADS, typename Op, typename List>
__global__ void __launch_bounds__(THREADS) pageOpKernel(PageOpParams params, List list)
{
    auto const position = static_cast<int32_t>(blockIdx.x / static_cast<uint32_t>(params.chunksPerPage));
    auto const chunk = static_cast<int32_t>(blockIdx.x % static_cast<uint32_t>(params.chunksPerPage));
    if (position >= list.size())
    {
        return;
    }
    LayerTableEntry const layer = params.table[params.firstLayer + static_cast<int32_t>(blockIdx.y) / params.halfCount];
    int32_t const half = params.firstHalf + static_cast<int32_t>(blockIdx.y) % params.halfCount;
    int64_t const chunkStart = chunk * kCHUNK_BYTES;
    if (chunkStart >= layer.pageBytes)
    {
        return;
    }
    int64_t const bytes = min(kCHUNK_BYTES, layer.pageBytes - chunkStart);
    bool const vectorised = layer.pageBytes % kVECTOR_BYTES == 0;
    char* const halfBase = layer.kBase + half * layer.halfBytes + chunkStart;
    bool const reportsErrors = chunk == 0 && blockIdx.y == 0 && threadIdx.x == 0 && params.errorCount != nullptr;

    auto const item = list[position];
    if constexpr (std::is_same_v<Op, CopyOp>)
    {
        if (item.src == kUNUSED_PAGE_ENTRY || item.dst == kUNUSED_PAGE_ENTRY)
        {
            return;
        }
        if (!isValidPage(item.src, params.numPages) || !isValidPage(item.dst, params.numPages))
        {
            if (reportsErrors)
            {
                atomicAdd(params.errorCount, 1);
            }
            return;
        }
        copyChunk<THREADS>(
            halfBase + item.src * layer.pageBytes, halfBase + item.dst * layer.pageBytes, bytes, vectorised);
    }
    else
    {
        if (item == kUNUSED_PAGE_ENTRY)
        {
            return;
        }
        if (!isValidPage(item, params.numPages))
        {
            if (reportsErrors)
            {
                atomicAdd(params.errorCount, 1);
            }
            return;
        }
        fillChunk<THREADS>(halfBase + item * layer.pageBytes, chunkStart, bytes, vectorised, params.pattern);
    }
}

__global__ void uploadLayerTableKernel(
    LayerTableEntry* dst, InlineList<LayerTableEntry, kTABLE_ENTRIES_PER_UPLOAD> entries)
{
    if (static_cast<int32_t>(threadIdx.x) < entries.count)
    {
        dst[threadIdx.x] = entries.items[threadIdx.x];
    }
}

//! The launch shape of one call, worked out and checked on the host; grid x is list entries x chunksPerPage.
struct Launch
{
    PageOpParams params;
    uint32_t gridY;
    bool samePageBytes; //!< every targeted layer has the same page size: no block of the grid is idle
};

Launch planLaunch(char const* what, KVCacheManager const& cache, PageOpTarget const& target, int32_t listCapacity,
    uint32_t pattern, int32_t* errorCount)
{
    int32_t const layerCount = cache.numLayers();
    if (target.firstLayer < 0 || (target.firstLayer >= layerCount && layerCount > 0)
        || (layerCount == 0 && target.firstLayer != 0))
    {
        throw InvalidArgumentError(fmt::format(
            "{}: PageOpTarget.firstLayer is {}; it must be in [0, {})", what, target.firstLayer, layerCount));
    }
    int32_t const available = layerCount - target.firstLayer;
    if (target.numLayers < -1 || target.numLayers > available)
    {
        throw InvalidArgumentError(fmt::format("{}: PageOpTarget.numLayers is {}; it must be -1 (all) or in [0, {}] "
                                               "for firstLayer {} of {} layers",
            what, target.numLayers, available, target.firstLayer, layerCount));
    }
    if (target.half != KVHalf::kBOTH && target.half != KVHalf::kK && target.half != KVHalf::kV)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: PageOpTarget.half is {}; it must be kBOTH, kK or kV", what, static_cast<int32_t>(target.half)));
    }
    int32_t const numLayers = target.numLayers == -1 ? available : target.numLayers;
    int32_t const halfCount = target.half == KVHalf::kBOTH ? 2 : 1;

    int64_t maxPageBytes = 0;
    bool samePageBytes = true;
    for (int32_t i = target.firstLayer; i < target.firstLayer + numLayers; ++i)
    {
        int64_t const pageBytes = cache.getLayout().layers[static_cast<size_t>(i)].pageBytes;
        samePageBytes = samePageBytes && (maxPageBytes == 0 || pageBytes == maxPageBytes);
        maxPageBytes = std::max(maxPageBytes, pageBytes);
    }
    int64_t const chunksPerPage = (maxPageBytes + kCHUNK_BYTES - 1) / kCHUNK_BYTES;
    int64_t const gridX = int64_t{listCapacity} * chunksPerPage;
    int64_t const gridY = int64_t{numLayers} * halfCount;
    if (gridX > std::numeric_limits<int32_t>::max() || gridY > 65535)
    {
        throw InvalidArgumentError(fmt::format("{}: {} list entries x {} chunks per page and {} layer halves exceed "
                                               "one launch's grid ({} x 65535)",
            what, listCapacity, chunksPerPage, gridY, std::numeric_limits<int32_t>::max()));
    }
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    if (device != cache.device())
    {
        throw InvalidArgumentError(
            fmt::format("{}: the current device is {} but the cache lives on device {}", what, device, cache.device()));
    }
    return Launch{PageOpParams{cache.layerTable(), target.firstLayer, halfCount, target.half == KVHalf::kV ? 1 : 0,
                      static_cast<int32_t>(chunksPerPage), cache.numPages(), pattern, errorCount},
        static_cast<uint32_t>(gridY), samePageBytes};
}

//! Launches over `listSize` entries of `list` (the capacity, for device lists).
template <typename Op, typename List>
void launch(Launch const& shape, List const& list, int32_t listSize, cudaStream_t stream)
{
    if (listSize == 0 || shape.gridY == 0)
    {
        return;
    }
    dim3 const grid(static_cast<uint32_t>(listSize) * static_cast<uint32_t>(shape.params.chunksPerPage), shape.gridY);
    if (shape.samePageBytes && int64_t{grid.x} * grid.y > kMAX_NARROW_BLOCKS)
    {
        pageOpKernel<kWIDE_THREADS, Op, List><<<grid, kWIDE_THREADS, 0, stream>>>(shape.params, list);
    }
    else
    {
        pageOpKernel<kNARROW_THREADS, Op, List><<<grid, kNARROW_THREADS, 0, stream>>>(shape.params, list);
    }
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

template <typename Op, int32_t N, typename Item>
void launchInline(Launch const& shape, Item const* items, int32_t count, cudaStream_t stream)
{
    InlineList<Item, N> list;
    list.count = count;
    std::copy(items, items + count, list.items);
    launch<Op>(shape, list, count, stream);
}

//! Launches a validated host list as kernel parameters, kMAX_INLINE_PAGE_OPS entries a launch.
template <typename Op, typename Item>
void launchHostList(Launch const& shape, Item const* items, int32_t count, cudaStream_t stream)
{
    for (int32_t first = 0; first < count; first += kMAX_INLINE_PAGE_OPS)
    {
        int32_t const part = std::min(kMAX_INLINE_PAGE_OPS, count - first);
        if (part <= kSMALL_INLINE_LIST)
        {
            launchInline<Op, kSMALL_INLINE_LIST>(shape, items + first, part, stream);
        }
        else
        {
            launchInline<Op, kMAX_INLINE_PAGE_OPS>(shape, items + first, part, stream);
        }
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
//! and `readAt(i)` return the i-th written and read page ids, already checked to be in range.
template <typename WrittenAt, typename ReadAt>
void checkDisjoint(char const* what, int32_t writtenCount, WrittenAt writtenAt, int32_t readCount, ReadAt readAt)
{
    // An open-addressing set of the written ids, at most half full: linear time, where sorting the list cost more
    // than the launch itself. Lists up to one launch's size use a stack table, so the common call allocates nothing.
    constexpr int32_t kLOCAL_SLOTS = 2 * kMAX_INLINE_PAGE_OPS;
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
    std::fill(table, table + slots, kUNUSED_PAGE_ENTRY);
    auto const slotOf = [slotBits](int32_t id) { return (static_cast<uint32_t>(id) * 2654435761U) >> (32 - slotBits); };
    size_t const mask = slots - 1;
    // The slot holding `id`, or the empty slot where it would go.
    auto const probe = [&](int32_t id)
    {
        size_t slot = slotOf(id);
        while (table[slot] != kUNUSED_PAGE_ENTRY && table[slot] != id)
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
            throw InvalidArgumentError(fmt::format("{}: page {} is a destination more than once", what, id));
        }
        table[slot] = id;
    }
    for (int32_t i = 0; i < readCount; ++i)
    {
        int32_t const id = readAt(i);
        if (table[probe(id)] == id)
        {
            throw InvalidArgumentError(
                fmt::format("{}: page {} is both a source and a destination in one call", what, id));
        }
    }
}

void checkListArguments(char const* what, void const* list, int32_t count)
{
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the list length is {}; it must be >= 0", what, count));
    }
    if (list == nullptr && count > 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the list is null but its length is {}", what, count));
    }
}

} // namespace

void uploadLayerTable(LayerTableEntry* dst, LayerTableEntry const* entries, int32_t count, cudaStream_t stream)
{
    for (int32_t first = 0; first < count; first += kTABLE_ENTRIES_PER_UPLOAD)
    {
        InlineList<LayerTableEntry, kTABLE_ENTRIES_PER_UPLOAD> part{};
        part.count = std::min(kTABLE_ENTRIES_PER_UPLOAD, count - first);
        std::copy(entries + first, entries + first + part.count, part.items);
        uploadLayerTableKernel<<<1, kTABLE_ENTRIES_PER_UPLOAD, 0, stream>>>(dst + first, part);
        KVCACHE_CUDA_TRY(cudaGetLastError());
    }
}

} // namespace detail

void copyPages(KVCacheManager const& cache, PageCopy const* pairs, int32_t numPairs, cudaStream_t stream,
    PageOpTarget const& target)
{
    constexpr char const* kWHAT = "copyPages";
    detail::checkListArguments(kWHAT, pairs, numPairs);
    for (int32_t i = 0; i < numPairs; ++i)
    {
        detail::checkId(kWHAT, "pairs.src", i, pairs[i].src, cache.numPages());
        detail::checkId(kWHAT, "pairs.dst", i, pairs[i].dst, cache.numPages());
    }
    detail::checkDisjoint(
        kWHAT, numPairs, [pairs](int32_t i) { return pairs[i].dst; }, numPairs,
        [pairs](int32_t i) { return pairs[i].src; });
    detail::Launch const shape =
        detail::planLaunch(kWHAT, cache, target, std::min(numPairs, kMAX_INLINE_PAGE_OPS), 0, nullptr);
    detail::launchHostList<detail::CopyOp>(shape, pairs, numPairs, stream);
}

void copyPages(
    KVCacheManager const& cache, std::vector<PageCopy> const& pairs, cudaStream_t stream, PageOpTarget const& target)
{
    if (pairs.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    {
        throw InvalidArgumentError(fmt::format("copyPages: {} pairs exceed the int32 list limit", pairs.size()));
    }
    copyPages(cache, pairs.data(), static_cast<int32_t>(pairs.size()), stream, target);
}

void copyPagesDevice(KVCacheManager const& cache, PageCopy const* devicePairs, int32_t maxPairs,
    int32_t const* deviceNumPairs, cudaStream_t stream, PageOpTarget const& target, int32_t* deviceErrorCount)
{
    constexpr char const* kWHAT = "copyPagesDevice";
    detail::checkListArguments(kWHAT, devicePairs, maxPairs);
    detail::Launch const shape = detail::planLaunch(kWHAT, cache, target, maxPairs, 0, deviceErrorCount);
    detail::launch<detail::CopyOp>(
        shape, detail::DeviceList<PageCopy>{devicePairs, deviceNumPairs, maxPairs}, maxPairs, stream);
}

void resetPages(KVCacheManager const& cache, int32_t const* pages, int32_t numPages, cudaStream_t stream,
    uint32_t pattern, PageOpTarget const& target)
{
    constexpr char const* kWHAT = "resetPages";
    detail::checkListArguments(kWHAT, pages, numPages);
    for (int32_t i = 0; i < numPages; ++i)
    {
        detail::checkId(kWHAT, "pages", i, pages[i], cache.numPages());
    }
    detail::checkDisjoint(
        kWHAT, numPages, [pages](int32_t i) { return pages[i]; }, 0, [](int32_t) { return kUNUSED_PAGE_ENTRY; });
    detail::Launch const shape =
        detail::planLaunch(kWHAT, cache, target, std::min(numPages, kMAX_INLINE_PAGE_OPS), pattern, nullptr);
    detail::launchHostList<detail::ResetOp>(shape, pages, numPages, stream);
}

void resetPages(KVCacheManager const& cache, std::vector<int32_t> const& pages, cudaStream_t stream, uint32_t pattern,
    PageOpTarget const& target)
{
    if (pages.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    {
        throw InvalidArgumentError(fmt::format("resetPages: {} pages exceed the int32 list limit", pages.size()));
    }
    resetPages(cache, pages.data(), static_cast<int32_t>(pages.size()), stream, pattern, target);
}

void resetPagesDevice(KVCacheManager const& cache, int32_t const* devicePages, int32_t maxPages,
    int32_t const* deviceNumPages, cudaStream_t stream, uint32_t pattern, PageOpTarget const& target,
    int32_t* deviceErrorCount)
{
    constexpr char const* kWHAT = "resetPagesDevice";
    detail::checkListArguments(kWHAT, devicePages, maxPages);
    detail::Launch const shape = detail::planLaunch(kWHAT, cache, target, maxPages, pattern, deviceErrorCount);
    detail::launch<detail::ResetOp>(
        shape, detail::DeviceList<int32_t>{devicePages, deviceNumPages, maxPages}, maxPages, stream);
}

} // namespace kvcache::rt
