// The host tier's kernels walk (list entry, table entry, half, chunk) work items, moving each between a cache page and
// its place in a host page: a mapped pinned host page (the kernel path: a small grid, in launches of bounded size) or a
// device staging host page (the copy-engine path's gather and scatter, on the whole GPU). Table entries are the
// group's data entries, then its scale entries: one walk moves a page's data and scales.

#include "tiers/host_tier/host_tier_kernels.h"

#include "device/block_shape.h"
#include "device/cache_hints.cuh"
#include "device/page_lists.cuh"
#include "device/page_mover.cuh"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <algorithm>

namespace kvcache::rt::detail
{
namespace
{

//! A warp moving the kernel's chunk.
using HostTierShape = BlockShape<kWARP_THREADS, kHOST_TIER_WARP_VECTORS>;
static_assert(HostTierShape::kCHUNK_BYTES == kHOST_TIER_KERNEL_CHUNK_BYTES);
static_assert(kHOST_TIER_MAPPED_THREADS % kWARP_THREADS == 0 && kHOST_TIER_STAGING_THREADS % kWARP_THREADS == 0);

// The explicit minimum of one block lets ptxas use the registers it needs: left to itself it spilled one on sm_80.
template <bool TO_HOST, int32_t THREADS, typename List>
__global__ void __launch_bounds__(THREADS, 1) hostTierKernel(HostTierKernelParams params, List list)
{
    // 32-bit indices: 64-bit division is a slow helper call; the host keeps every launch below 2^32 items.
    auto const itemsPerHalf = static_cast<uint32_t>(params.chunksPerHalf);
    uint32_t const itemsPerEntry = static_cast<uint32_t>(params.numEntries) * 2 * itemsPerHalf;
    uint32_t const items = static_cast<uint32_t>(list.size()) * itemsPerEntry;
    constexpr uint32_t kWARPS = THREADS / kWARP_THREADS;
    auto const lane = static_cast<int32_t>(threadIdx.x % kWARP_THREADS);
    for (uint32_t item = blockIdx.x * kWARPS + threadIdx.x / kWARP_THREADS; item < items; item += gridDim.x * kWARPS)
    {
        auto const position = static_cast<int32_t>(item / itemsPerEntry);
        uint32_t const withinEntry = item - static_cast<uint32_t>(position) * itemsPerEntry;
        uint32_t const tableIndex = withinEntry / (2 * itemsPerHalf);
        uint32_t const withinTableEntry = withinEntry - tableIndex * 2 * itemsPerHalf;
        uint32_t const halfIndex = withinTableEntry / itemsPerHalf;
        auto const tableEntry = static_cast<int32_t>(tableIndex);
        auto const half = static_cast<int32_t>(halfIndex);
        int64_t const chunkStart = int64_t{withinTableEntry - halfIndex * itemsPerHalf} * kHOST_TIER_KERNEL_CHUNK_BYTES;

        HostTierEntry const entry = list[position];
        if (entry.page == kUNUSED_PAGE_ENTRY || entry.hostPage == kUNUSED_PAGE_ENTRY)
        {
            continue;
        }
        bool const valid = entry.page >= 0 && entry.page < params.numPages && entry.hostPage >= 0
            && entry.hostPage < params.numHostPages
            && params.chunks[static_cast<uint32_t>(entry.hostPage) / params.hostPagesPerChunk] != nullptr;
        if (!valid)
        {
            // Counted once per entry: by the warp holding its first item.
            if (withinEntry == 0 && lane == 0 && params.errorCount != nullptr)
            {
                atomicAdd(params.errorCount, 1);
            }
            continue;
        }
        LayerTableEntry const layerEntry = loadLayer(params.table + tableEntry);
        int64_t const pageBytes = layerEntry.pageBytes();
        if ((half == 1 && !layerEntry.hasV()) || chunkStart >= pageBytes)
        {
            continue;
        }
        int64_t const bytes = min(kHOST_TIER_KERNEL_CHUNK_BYTES, pageBytes - chunkStart);
        char* const devicePage = layerEntry.halfAddress(half, params.numPages, entry.page) + chunkStart;
        uint32_t const chunk = static_cast<uint32_t>(entry.hostPage) / params.hostPagesPerChunk;
        char* const hostPage = params.chunks[chunk]
            + int64_t{static_cast<uint32_t>(entry.hostPage) - chunk * params.hostPagesPerChunk} * params.hostPageBytes
            + params.entryOffsets[tableEntry] + half * pageBytes + chunkStart;
        // Pools are 256-byte aligned and chunks page aligned; offsets inside are multiples of a page or a host page.
        bool const vectorised = (reinterpret_cast<uintptr_t>(devicePage) % 16 == 0)
            && (reinterpret_cast<uintptr_t>(hostPage) % 16 == 0) && bytes % 16 == 0;
        // Streaming hints: a host page, mapped host memory or staging, is touched once and should not displace the L2's
        // working set.
        if constexpr (TO_HOST)
        {
            moveChunk<HostTierShape>(devicePage, hostPage, bytes, vectorised, StreamingAccess{}, lane);
        }
        else
        {
            moveChunk<HostTierShape>(hostPage, devicePage, bytes, vectorised, StreamingAccess{}, lane);
        }
    }
}

template <int32_t THREADS, typename List>
void launch(HostTierKernelParams const& params, bool toHost, List const& list, int64_t items, int32_t maxGrid,
    cudaStream_t stream)
{
    if (items == 0)
    {
        return;
    }
    int64_t const warpsPerBlock = THREADS / kWARP_THREADS;
    auto const grid = static_cast<uint32_t>(
        std::max<int64_t>(1, std::min<int64_t>((items + warpsPerBlock - 1) / warpsPerBlock, maxGrid)));
    if (toHost)
    {
        hostTierKernel<true, THREADS, List><<<grid, THREADS, 0, stream>>>(params, list);
    }
    else
    {
        hostTierKernel<false, THREADS, List><<<grid, THREADS, 0, stream>>>(params, list);
    }
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

//! Moves a host list in launches of `step` entries carried as kernel parameters.
template <int32_t THREADS>
void launchInline(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries, int32_t count,
    int32_t step, int32_t maxGrid, cudaStream_t stream)
{
    for (int32_t first = 0; first < count; first += step)
    {
        int32_t const part = std::min(step, count - first);
        launch<THREADS>(params, toHost, makeInlineList<kMAX_INLINE_PAGE_OPS>(entries + first, part),
            part * hostTierItemsPerEntry(params), maxGrid, stream);
    }
}

} // namespace

int64_t hostTierItemsPerEntry(HostTierKernelParams const& params)
{
    return int64_t{params.numEntries} * 2 * params.chunksPerHalf;
}

int32_t hostTierEntriesPerLaunch(int64_t hostPageBytes)
{
    return static_cast<int32_t>(std::clamp<int64_t>(
        kHOST_TIER_KERNEL_LAUNCH_BYTES / std::max<int64_t>(hostPageBytes, 1), 1, kMAX_INLINE_PAGE_OPS));
}

void launchHostTierKernel(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries, int32_t count,
    int32_t maxGrid, cudaStream_t stream)
{
    launchInline<kHOST_TIER_MAPPED_THREADS>(
        params, toHost, entries, count, hostTierEntriesPerLaunch(params.hostPageBytes), maxGrid, stream);
}

void launchHostTierKernelDevice(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries,
    int32_t capacity, int32_t const* deviceCount, int32_t maxGrid, cudaStream_t stream)
{
    int32_t const step = std::max(hostTierEntriesPerLaunch(params.hostPageBytes),
        (capacity + kHOST_TIER_DEVICE_LIST_MAX_LAUNCHES - 1) / kHOST_TIER_DEVICE_LIST_MAX_LAUNCHES);
    for (int32_t first = 0; first < capacity; first += step)
    {
        int32_t const positions = std::min(step, capacity - first);
        launch<kHOST_TIER_MAPPED_THREADS>(params, toHost,
            DeviceList<HostTierEntry>{entries + first, deviceCount, first, positions},
            positions * hostTierItemsPerEntry(params), maxGrid, stream);
    }
}

void launchStagingKernel(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries, int32_t count,
    int32_t grid, cudaStream_t stream)
{
    launchInline<kHOST_TIER_STAGING_THREADS>(params, toHost, entries, count, kMAX_INLINE_PAGE_OPS, grid, stream);
}

} // namespace kvcache::rt::detail
