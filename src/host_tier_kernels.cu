// The host tier's kernel: a small grid walks (entry, layer, half, chunk) work items, moving each between a cache page
// and its place in a mapped pinned slot.

#include "host_tier_kernels.h"

#include "cache_hints.cuh"

#include "kvcache/errors.h"
#include "kvcache/page_ops.h"

#include <algorithm>
#include <type_traits>

namespace kvcache::rt::detail
{
namespace
{

constexpr int32_t kVECTORS_PER_THREAD =
    static_cast<int32_t>(kHOST_TIER_KERNEL_CHUNK_BYTES / (16 * int64_t{kHOST_TIER_KERNEL_THREADS}));
static_assert(kVECTORS_PER_THREAD * 16 * kHOST_TIER_KERNEL_THREADS == kHOST_TIER_KERNEL_CHUNK_BYTES);

template <int32_t N>
struct InlineEntries
{
    HostTierEntry items[N];
    int32_t count;

    __device__ int32_t size() const
    {
        return count;
    }
    __device__ HostTierEntry operator[](int32_t i) const
    {
        return items[i];
    }
};

struct DeviceEntries
{
    HostTierEntry const* items;
    int32_t const* count;
    int32_t capacity;

    __device__ int32_t size() const
    {
        return count == nullptr ? capacity : min(max(loadWord(count), 0), capacity);
    }
    __device__ HostTierEntry operator[](int32_t i) const
    {
        return HostTierEntry{loadWord(&items[i].page), loadWord(&items[i].slot)};
    }
};

//! Moves `bytes` bytes; `vectorised` when both ends and the length are whole 16-byte vectors. Host memory is read
//! and written with streaming hints: it is touched once and should not displace the L2's working set.
__device__ void moveChunk(char const* __restrict__ src, char* __restrict__ dst, int64_t bytes, bool vectorised)
{
    if (vectorised && bytes == kHOST_TIER_KERNEL_CHUNK_BYTES)
    {
        // A whole chunk: every thread issues all its loads before its first store.
        auto const* from = reinterpret_cast<int4 const*>(src) + threadIdx.x;
        auto* to = reinterpret_cast<int4*>(dst) + threadIdx.x;
        int4 staged[kVECTORS_PER_THREAD];
#pragma unroll
        for (int32_t k = 0; k < kVECTORS_PER_THREAD; ++k)
        {
            staged[k] = __ldcs(from + k * kHOST_TIER_KERNEL_THREADS);
        }
#pragma unroll
        for (int32_t k = 0; k < kVECTORS_PER_THREAD; ++k)
        {
            __stcs(to + k * kHOST_TIER_KERNEL_THREADS, staged[k]);
        }
    }
    else if (vectorised)
    {
        auto const* from = reinterpret_cast<int4 const*>(src);
        auto* to = reinterpret_cast<int4*>(dst);
        for (int64_t i = threadIdx.x; i < bytes / 16; i += kHOST_TIER_KERNEL_THREADS)
        {
            __stcs(to + i, __ldcs(from + i));
        }
    }
    else
    {
        for (int64_t i = threadIdx.x; i < bytes; i += kHOST_TIER_KERNEL_THREADS)
        {
            dst[i] = src[i];
        }
    }
}

template <bool TO_HOST, typename List>
__global__ void __launch_bounds__(kHOST_TIER_KERNEL_THREADS) hostTierKernel(HostTierKernelParams params, List list)
{
    // 32-bit indices: 64-bit division is a slow helper call; the host keeps every launch below 2^32 items.
    auto const itemsPerHalf = static_cast<uint32_t>(params.chunksPerHalf);
    uint32_t const itemsPerEntry = static_cast<uint32_t>(params.numLayers) * 2 * itemsPerHalf;
    uint32_t const items = static_cast<uint32_t>(list.size()) * itemsPerEntry;
    for (uint32_t item = blockIdx.x; item < items; item += gridDim.x)
    {
        auto const position = static_cast<int32_t>(item / itemsPerEntry);
        uint32_t const withinEntry = item - static_cast<uint32_t>(position) * itemsPerEntry;
        uint32_t const layerIndex = withinEntry / (2 * itemsPerHalf);
        uint32_t const withinLayer = withinEntry - layerIndex * 2 * itemsPerHalf;
        uint32_t const halfIndex = withinLayer / itemsPerHalf;
        auto const layer = static_cast<int32_t>(layerIndex);
        auto const half = static_cast<int32_t>(halfIndex);
        int64_t const chunkStart = int64_t{withinLayer - halfIndex * itemsPerHalf} * kHOST_TIER_KERNEL_CHUNK_BYTES;

        HostTierEntry const entry = list[position];
        if (entry.page == kUNUSED_PAGE_ENTRY || entry.slot == kUNUSED_PAGE_ENTRY)
        {
            continue;
        }
        bool const valid = entry.page >= 0 && entry.page < params.numPages && entry.slot >= 0
            && entry.slot < params.numSlots
            && params.chunks[static_cast<uint32_t>(entry.slot) / params.slotsPerChunk] != nullptr;
        if (!valid)
        {
            // Counted once per entry: by the block holding its first item.
            if (withinEntry == 0 && threadIdx.x == 0 && params.errorCount != nullptr)
            {
                atomicAdd(params.errorCount, 1);
            }
            continue;
        }
        LayerTableEntry const layerEntry = loadLayer(params.table + layer);
        int64_t const pageBytes = layerEntry.pageBytesAndV >> 1;
        bool const hasV = (layerEntry.pageBytesAndV & 1) != 0;
        if ((half == 1 && !hasV) || chunkStart >= pageBytes)
        {
            continue;
        }
        int64_t const bytes = min(kHOST_TIER_KERNEL_CHUNK_BYTES, pageBytes - chunkStart);
        char* const devicePage =
            layerEntry.kBase + (int64_t{half} * params.numPages + entry.page) * pageBytes + chunkStart;
        uint32_t const chunk = static_cast<uint32_t>(entry.slot) / params.slotsPerChunk;
        char* const hostPage = params.chunks[chunk]
            + int64_t{static_cast<uint32_t>(entry.slot) - chunk * params.slotsPerChunk} * params.slotBytes
            + params.layerOffsets[layer] + half * pageBytes + chunkStart;
        // Pools are 256-byte aligned and chunks page aligned; offsets inside are multiples of a page or a slot.
        bool const vectorised = (reinterpret_cast<uintptr_t>(devicePage) % 16 == 0)
            && (reinterpret_cast<uintptr_t>(hostPage) % 16 == 0) && bytes % 16 == 0;
        if constexpr (TO_HOST)
        {
            moveChunk(devicePage, hostPage, bytes, vectorised);
        }
        else
        {
            moveChunk(hostPage, devicePage, bytes, vectorised);
        }
    }
}

template <typename List>
void launch(HostTierKernelParams const& params, bool toHost, List const& list, int64_t items, int32_t maxGrid,
    cudaStream_t stream)
{
    if (items == 0)
    {
        return;
    }
    auto const grid = static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(items, maxGrid)));
    if (toHost)
    {
        hostTierKernel<true, List><<<grid, kHOST_TIER_KERNEL_THREADS, 0, stream>>>(params, list);
    }
    else
    {
        hostTierKernel<false, List><<<grid, kHOST_TIER_KERNEL_THREADS, 0, stream>>>(params, list);
    }
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

} // namespace

int64_t hostTierItemsPerEntry(HostTierKernelParams const& params)
{
    return int64_t{params.numLayers} * 2 * params.chunksPerHalf;
}

void launchHostTierKernel(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries, int32_t count,
    int32_t maxGrid, cudaStream_t stream)
{
    for (int32_t first = 0; first < count; first += kMAX_INLINE_PAGE_OPS)
    {
        InlineEntries<kMAX_INLINE_PAGE_OPS> list;
        list.count = std::min(kMAX_INLINE_PAGE_OPS, count - first);
        std::copy(entries + first, entries + first + list.count, list.items);
        launch(params, toHost, list, list.count * hostTierItemsPerEntry(params), maxGrid, stream);
    }
}

void launchHostTierKernelDevice(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries,
    int32_t capacity, int32_t const* deviceCount, int32_t maxGrid, cudaStream_t stream)
{
    launch(params, toHost, DeviceEntries{entries, deviceCount, capacity}, capacity * hostTierItemsPerEntry(params),
        maxGrid, stream);
}

} // namespace kvcache::rt::detail
