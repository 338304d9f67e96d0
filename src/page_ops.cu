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

// One block moves one chunk of one page of one half of one layer, all its loads issued before its stores.
constexpr int64_t kVECTOR_BYTES = 16;

//! A block of THREADS threads, each moving VECTORS 16-byte vectors of one chunk.
template <int32_t THREADS, int32_t VECTORS>
struct BlockShape
{
    static constexpr int32_t kTHREADS = THREADS;
    static constexpr int32_t kVECTORS = VECTORS;
    static constexpr int64_t kCHUNK_BYTES = int64_t{THREADS} * VECTORS * kVECTOR_BYTES;
};
// Measured on an H200 (docs/benchmarks.md): wide blocks (1024 threads x 2 vectors, 32 KiB chunks) copy long lists
// fastest; short lists finish sooner in narrow blocks (128 x 8, 16 KiB chunks), which start and exit cheaply and
// spread a few pages over every multiprocessor. Narrow blocks also serve layers of mixed page sizes, where the grid
// holds idle blocks and a wide one would hold half a multiprocessor while it starts and exits.
using WideShape = BlockShape<1024, 2>;
using NarrowShape = BlockShape<256, 8>;
//! Lists whose wide grid has at most this many blocks run in narrow blocks.
constexpr int64_t kMAX_WIDE_BLOCKS_FOR_NARROW = 4096;
//! CUDA's limit on a grid's y and z dimensions.
constexpr int64_t kMAX_GRID_YZ = 65535;
static_assert(kMAX_DEVICE_PAGE_OPS_PER_LAUNCH == kMAX_GRID_YZ);
constexpr int32_t kTABLE_ENTRIES_PER_UPLOAD = 64;
// Short host lists travel in a small parameter block: a launch copies its whole parameter block.
constexpr int32_t kSMALL_INLINE_LIST = 32;

//! What every page kernel needs besides its list: which layers and halves, and the id range.
struct PageOpParams
{
    LayerTableEntry const* table;
    int32_t firstLayer;
    int32_t halfBits;  //!< 1 when both halves are targeted (grid z = layer slot * 2 + half), else 0
    int32_t firstHalf; //!< 0 for K, 1 for V
    int32_t numPages;
    int32_t firstPosition; //!< list position of grid row y = 0: a grid has at most kMAX_GRID_YZ rows
    bool keepSourcesInL2;  //!< copies: read sources at L2 priority evict_last (see copyChunk)
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
    static_assert(N <= kMAX_GRID_YZ);

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

//! Reads a 4-byte word. `.nc` is safe: nothing writes lists or the layer table while a page kernel runs.
__device__ __forceinline__ int32_t loadWord(int32_t const* word)
{
    int32_t value;
    asm("ld.global.nc.b32 %0, [%1];" : "=r"(value) : "l"(word));
    return value;
}

//! Reads one layer table entry with one 16-byte load.
__device__ __forceinline__ LayerTableEntry loadLayer(LayerTableEntry const* entry)
{
    static_assert(sizeof(LayerTableEntry) == 16 && alignof(LayerTableEntry) == 16);
    uint64_t base, pageBytes;
    asm("ld.global.nc.v2.b64 {%0, %1}, [%2];" : "=l"(base), "=l"(pageBytes) : "l"(entry));
    return LayerTableEntry{reinterpret_cast<char*>(base), static_cast<int64_t>(pageBytes)};
}

//! A list in device memory whose length a graph replay may change through `count`.
template <typename Item>
struct DeviceList
{
    Item const* items;
    int32_t const* count;
    int32_t capacity;

    __device__ int32_t size() const
    {
        return count == nullptr ? capacity : min(max(loadWord(count), 0), capacity);
    }
    //! `i` must be below capacity (the grid guarantees it), so the read stays inside the caller's list.
    __device__ Item operator[](int32_t i) const
    {
        if constexpr (std::is_same_v<Item, PageCopy>)
        {
            return PageCopy{loadWord(&items[i].src), loadWord(&items[i].dst)};
        }
        else
        {
            return loadWord(&items[i]);
        }
    }
};

__device__ bool isValidPage(int32_t id, int32_t numPages)
{
    return id >= 0 && id < numPages;
}

//! Reads 16 bytes with L2 eviction priority evict_last (`policy` from evictLastPolicy()).
__device__ __forceinline__ int4 loadKeepingInL2(int4 const* from, uint64_t policy)
{
    int4 v;
    asm("ld.global.cg.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(from), "l"(policy));
    return v;
}

__device__ __forceinline__ uint64_t evictLastPolicy()
{
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

//! Gives the 128-byte L2 line at `line` (128-aligned) back its normal eviction priority.
__device__ __forceinline__ void releaseL2Line(void const* line)
{
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(line) : "memory");
}

constexpr int64_t kL2_LINE_BYTES = 128;
//! Copies that write more than this read their sources at L2 priority evict_last (see copyChunk); smaller ones fit
//! in the L2 of the GPUs kvcache targets (40 MiB and up).
constexpr int64_t kMIN_BYTES_TO_KEEP_SOURCES = int64_t{32} << 20;

//! Copies one chunk. `lineAligned`: the chunk starts on an L2 line and no line of it is shared with another chunk.
//!
//! With `keepSources`, sources are read at L2 priority evict_last and set back to normal once the stores are issued.
//! While a large copy runs, the L2 then evicts written (dirty) lines ahead of read-once source lines, so writes reach
//! memory nearly in the order they were made. Measured on an H200 for 256 page pairs x 32 layers: 92% -> 96% of a
//! contiguous copy for scattered pages, 98% -> 100% for runs of pages. Setting the priority back leaves no evict_last
//! lines to crowd later kernels' data out of the L2. A copy that fits in the L2 gains nothing and pays for the extra
//! instructions (0.25 us of a single-pair copy), so small calls read plainly.
template <typename Shape>
__device__ void copyChunk(char const* __restrict__ src, char* __restrict__ dst, int64_t bytes, bool vectorised,
    bool lineAligned, bool keepSources)
{
    constexpr int32_t THREADS = Shape::kTHREADS;
    if (lineAligned && bytes == Shape::kCHUNK_BYTES)
    {
        auto const* from = reinterpret_cast<int4 const*>(src) + threadIdx.x;
        auto* to = reinterpret_cast<int4*>(dst) + threadIdx.x;
        int4 staged[Shape::kVECTORS];
        if (keepSources)
        {
            uint64_t const keep = evictLastPolicy();
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                staged[k] = loadKeepingInL2(from + k * THREADS, keep);
            }
        }
        else
        {
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                staged[k] = __ldcg(from + k * THREADS);
            }
        }
#pragma unroll
        for (int32_t k = 0; k < Shape::kVECTORS; ++k)
        {
            __stcg(to + k * THREADS, staged[k]);
        }
        if (keepSources)
        {
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                if (reinterpret_cast<uintptr_t>(from + k * THREADS) % kL2_LINE_BYTES == 0)
                {
                    releaseL2Line(from + k * THREADS);
                }
            }
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

template <typename Shape>
__device__ void fillChunk(char* dst, int64_t offset, int64_t bytes, bool vectorised, uint32_t pattern)
{
    constexpr int32_t THREADS = Shape::kTHREADS;
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

//! Grid: x = chunk of a page, y = list position - firstPosition, z = targeted layer * (1 + halfBits) + half. Blocks
//! run in that order, so the chunks of a few pages of one layer half are in flight together. No index needs a
//! division: two of them cost 0.3 us of a 12 us single-pair copy.
template <typename Shape, typename Op, typename List>
__global__ void __launch_bounds__(Shape::kTHREADS) pageOpKernel(PageOpParams params, List list)
{
    auto const chunk = static_cast<int32_t>(blockIdx.x);
    int32_t const layerSlot = static_cast<int32_t>(blockIdx.z >> params.halfBits);
    int32_t const half = params.firstHalf + static_cast<int32_t>(blockIdx.z & params.halfBits);
    int64_t const chunkStart = chunk * Shape::kCHUNK_BYTES;
    // Every value a block depends on is loaded before one combined branch, so the loads travel together. Checked one
    // by one behind early exits, the compiler fetched them one after another: three dependent round trips ahead of
    // the first page load, 0.7 us of a 12 us single-pair copy on an H200. Reading an entry before comparing its
    // position with the list's length stays inside the list: the grid keeps positions below its capacity.
    LayerTableEntry const layer = loadLayer(params.table + params.firstLayer + layerSlot);
    int32_t const position = params.firstPosition + static_cast<int32_t>(blockIdx.y);
    auto const item = list[position];
    bool const listed = position < list.size();
    bool unused = false;
    bool valid = false;
    int32_t readPage = 0;
    int32_t writePage = 0;
    if constexpr (std::is_same_v<Op, CopyOp>)
    {
        unused = (item.src == kUNUSED_PAGE_ENTRY) | (item.dst == kUNUSED_PAGE_ENTRY);
        valid = isValidPage(item.src, params.numPages) & isValidPage(item.dst, params.numPages);
        readPage = item.src;
        writePage = item.dst;
    }
    else
    {
        unused = item == kUNUSED_PAGE_ENTRY;
        valid = isValidPage(item, params.numPages);
        writePage = item;
    }
    if (!(listed & !unused & valid & (chunkStart < layer.pageBytes)))
    {
        bool const reportsErrors = chunk == 0 && blockIdx.z == 0 && threadIdx.x == 0 && params.errorCount != nullptr;
        if (listed && !unused && !valid && reportsErrors)
        {
            atomicAdd(params.errorCount, 1);
        }
        return;
    }
    int64_t const bytes = min(Shape::kCHUNK_BYTES, layer.pageBytes - chunkStart);
    bool const vectorised = layer.pageBytes % kVECTOR_BYTES == 0;
    // Pools start 256-byte aligned, so pages (and their chunks) start on L2 lines when their size is whole lines.
    bool const lineAligned = layer.pageBytes % kL2_LINE_BYTES == 0;
    char* const halfBase = layer.kBase + int64_t{half} * params.numPages * layer.pageBytes + chunkStart;
    if constexpr (std::is_same_v<Op, CopyOp>)
    {
        copyChunk<Shape>(halfBase + readPage * layer.pageBytes, halfBase + writePage * layer.pageBytes, bytes,
            vectorised, lineAligned, params.keepSourcesInL2);
    }
    else
    {
        fillChunk<Shape>(halfBase + writePage * layer.pageBytes, chunkStart, bytes, vectorised, params.pattern);
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

//! The launch of one call, worked out and checked on the host.
struct Launch
{
    PageOpParams params;
    int64_t maxPageBytes;  //!< the largest page of the targeted layers
    int64_t bytesPerEntry; //!< bytes one list entry writes: its page in every targeted layer and half
    uint32_t gridZ;        //!< targeted layer halves
    bool samePageBytes;    //!< every targeted layer has the same page size: no block of the grid is idle
};

template <typename Shape>
int64_t chunksPerPage(int64_t pageBytes)
{
    return (pageBytes + Shape::kCHUNK_BYTES - 1) / Shape::kCHUNK_BYTES;
}

Launch planLaunch(
    char const* what, KVCacheManager const& cache, PageOpTarget const& target, uint32_t pattern, int32_t* errorCount)
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
    int32_t const halfBits = target.half == KVHalf::kBOTH ? 1 : 0;

    int64_t maxPageBytes = 0;
    int64_t bytesPerEntry = 0;
    bool samePageBytes = true;
    for (int32_t i = target.firstLayer; i < target.firstLayer + numLayers; ++i)
    {
        int64_t const pageBytes = cache.getLayout().layers[static_cast<size_t>(i)].pageBytes;
        bytesPerEntry += pageBytes << halfBits;
        samePageBytes = samePageBytes && (maxPageBytes == 0 || pageBytes == maxPageBytes);
        maxPageBytes = std::max(maxPageBytes, pageBytes);
    }
    int64_t const gridZ = int64_t{numLayers} << halfBits;
    if (gridZ > kMAX_GRID_YZ)
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} layer halves exceed one launch's grid ({})", what, gridZ, kMAX_GRID_YZ));
    }
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    if (device != cache.device())
    {
        throw InvalidArgumentError(
            fmt::format("{}: the current device is {} but the cache lives on device {}", what, device, cache.device()));
    }
    return Launch{PageOpParams{cache.layerTable(), target.firstLayer, halfBits, target.half == KVHalf::kV ? 1 : 0,
                      cache.numPages(), 0, false, pattern, errorCount},
        maxPageBytes, bytesPerEntry, static_cast<uint32_t>(gridZ), samePageBytes};
}

//! Launches over `listSize` entries of `list` (the capacity, for device lists): one launch per kMAX_GRID_YZ entries.
template <typename Shape, typename Op, typename List>
void launchShaped(Launch const& plan, List const& list, int32_t listSize, cudaStream_t stream)
{
    PageOpParams params = plan.params;
    params.keepSourcesInL2 = listSize > kMIN_BYTES_TO_KEEP_SOURCES / plan.bytesPerEntry;
    auto const chunks = static_cast<uint32_t>(chunksPerPage<Shape>(plan.maxPageBytes));
    for (int64_t first = 0; first < listSize; first += kMAX_GRID_YZ)
    {
        params.firstPosition = static_cast<int32_t>(first);
        dim3 const grid(chunks, static_cast<uint32_t>(std::min(kMAX_GRID_YZ, listSize - first)), plan.gridZ);
        pageOpKernel<Shape, Op, List><<<grid, Shape::kTHREADS, 0, stream>>>(params, list);
        KVCACHE_CUDA_TRY(cudaGetLastError());
    }
}

//! Launches over `listSize` entries of `list` (the capacity, for device lists).
template <typename Op, typename List>
void launch(Launch const& plan, List const& list, int32_t listSize, cudaStream_t stream)
{
    if (listSize == 0 || plan.gridZ == 0)
    {
        return;
    }
    int64_t const wideBlocks = int64_t{listSize} * chunksPerPage<WideShape>(plan.maxPageBytes) * plan.gridZ;
    if (plan.samePageBytes && wideBlocks > kMAX_WIDE_BLOCKS_FOR_NARROW)
    {
        launchShaped<WideShape, Op>(plan, list, listSize, stream);
    }
    else
    {
        launchShaped<NarrowShape, Op>(plan, list, listSize, stream);
    }
}

template <typename Op, int32_t N, typename Item>
void launchInline(Launch const& plan, Item const* items, int32_t count, cudaStream_t stream)
{
    InlineList<Item, N> list;
    list.count = count;
    std::copy(items, items + count, list.items);
    launch<Op>(plan, list, count, stream);
}

//! Launches a validated host list as kernel parameters, kMAX_INLINE_PAGE_OPS entries a launch.
template <typename Op, typename Item>
void launchHostList(Launch const& plan, Item const* items, int32_t count, cudaStream_t stream)
{
    for (int32_t first = 0; first < count; first += kMAX_INLINE_PAGE_OPS)
    {
        int32_t const part = std::min(kMAX_INLINE_PAGE_OPS, count - first);
        if (part <= kSMALL_INLINE_LIST)
        {
            launchInline<Op, kSMALL_INLINE_LIST>(plan, items + first, part, stream);
        }
        else
        {
            launchInline<Op, kMAX_INLINE_PAGE_OPS>(plan, items + first, part, stream);
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
    detail::Launch const plan = detail::planLaunch(kWHAT, cache, target, 0, nullptr);
    detail::launchHostList<detail::CopyOp>(plan, pairs, numPairs, stream);
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
    detail::Launch const plan = detail::planLaunch(kWHAT, cache, target, 0, deviceErrorCount);
    detail::launch<detail::CopyOp>(
        plan, detail::DeviceList<PageCopy>{devicePairs, deviceNumPairs, maxPairs}, maxPairs, stream);
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
    detail::Launch const plan = detail::planLaunch(kWHAT, cache, target, pattern, nullptr);
    detail::launchHostList<detail::ResetOp>(plan, pages, numPages, stream);
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
    detail::Launch const plan = detail::planLaunch(kWHAT, cache, target, pattern, deviceErrorCount);
    detail::launch<detail::ResetOp>(
        plan, detail::DeviceList<int32_t>{devicePages, deviceNumPages, maxPages}, maxPages, stream);
}

} // namespace kvcache::rt
