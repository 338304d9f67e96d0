// The state copy: every listed slot copy, in every state tensor of every state layer, in one launch.

#include "device/page_lists.cuh"
#include "device/page_mover.cuh"
#include "memory/cache/layer_table.h"
#include "memory/page_ops/page_list_validation.h"
#include "memory/page_ops/page_op_plan.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace kvcache::rt
{
namespace detail
{
namespace
{

static_assert(
    WideShape::kCHUNK_BYTES == kSTATE_COPY_CHUNK_BYTES && NarrowShape::kCHUNK_BYTES == kSTATE_COPY_CHUNK_BYTES,
    "the state table numbers chunks of both block shapes");
static_assert(kMAX_INLINE_STATE_COPIES <= kMAX_GRID_YZ, "one launch's copies must fit its grid");

// Short lists travel in a small parameter block: a launch copies its whole parameter block.
constexpr int32_t kSMALL_INLINE_LIST = 32;

struct StateCopyParams
{
    StateTableEntry const* table;
    int32_t numTensors;
};

//! Grid: x = chunk of one slot of every state tensor (StateTableEntry::firstChunk numbers them), y = copy. Every block
//! has bytes to move: chunks are numbered tensor by tensor, so no block idles on a small tensor beside a large one.
//! KEEP_SOURCES: read sources at L2 priority evict_last (see CacheGlobalAccess); a template argument, as a run-time
//! flag made the narrow kernel spill registers.
template <typename Shape, bool KEEP_SOURCES, typename List>
__global__ void __launch_bounds__(Shape::kTHREADS) stateCopyKernel(StateCopyParams params, List list)
{
    auto const chunk = static_cast<int64_t>(blockIdx.x);
    // The tensor of this chunk: the last whose firstChunk is at most `chunk` (the first tensor's is 0).
    int32_t low = 0;
    int32_t high = params.numTensors - 1;
    while (low < high)
    {
        int32_t const middle = (low + high + 1) / 2;
        if (__ldg(&params.table[middle].firstChunk) <= chunk)
        {
            low = middle;
        }
        else
        {
            high = middle - 1;
        }
    }
    StateTableEntry const* const entry = params.table + low;
    char* const base = reinterpret_cast<char*>(__ldg(reinterpret_cast<long long const*>(&entry->base)));
    int64_t const slotBytes = __ldg(&entry->slotBytes);
    int64_t const chunkStart = (chunk - __ldg(&entry->firstChunk)) * Shape::kCHUNK_BYTES;
    StateSlotCopy const copy = list[static_cast<int32_t>(blockIdx.y)];
    int64_t const bytes = min(Shape::kCHUNK_BYTES, slotBytes - chunkStart);
    char const* const src = base + copy.src * slotBytes + chunkStart;
    char* const dst = base + copy.dst * slotBytes + chunkStart;
    // Tensors start 256-byte aligned; a slot size that is not a multiple of 16 bytes leaves some slots unaligned, and
    // those (and a tensor's last chunk when its bytes are not whole vectors) move byte by byte.
    bool const vectorised =
        ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(bytes))
            % kVECTOR_BYTES)
        == 0;
    moveChunk<Shape>(src, dst, bytes, vectorised, CacheGlobalAccess{KEEP_SOURCES}, static_cast<int32_t>(threadIdx.x));
}

template <typename Shape, typename List>
void launchShaped(StateCopyParams const& params, bool keepSources, int64_t chunks, List const& list, int32_t count,
    cudaStream_t stream)
{
    dim3 const grid(static_cast<uint32_t>(chunks), static_cast<uint32_t>(count));
    if (keepSources)
    {
        stateCopyKernel<Shape, true, List><<<grid, Shape::kTHREADS, 0, stream>>>(params, list);
    }
    else
    {
        stateCopyKernel<Shape, false, List><<<grid, Shape::kTHREADS, 0, stream>>>(params, list);
    }
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

template <typename List>
void launch(StateCopyParams const& params, bool keepSources, int64_t chunks, List const& list, int32_t count,
    cudaStream_t stream)
{
    // Every block of the grid moves bytes, so the page copy's rule for grids without idle blocks applies.
    if (wideBlocksPay(chunks * count))
    {
        launchShaped<WideShape>(params, keepSources, chunks, list, count, stream);
    }
    else
    {
        launchShaped<NarrowShape>(params, keepSources, chunks, list, count, stream);
    }
}

} // namespace
} // namespace detail

void copyStates(KVCacheManager const& cache, StateSlotCopy const* copies, int32_t count, cudaStream_t stream)
{
    constexpr char const* kWHAT = "copyStates";
    detail::validateStateCopyList(kWHAT, copies, count, cache.numStateSlots());
    if (count == 0)
    {
        return;
    }
    detail::checkCacheDevice(kWHAT, cache);
    KVCacheLayout const& layout = cache.layout();
    int64_t const chunks = detail::stateCopyChunks(layout);
    // CUDA's limit on a grid's x dimension: a slot of over 64 TiB.
    if (chunks > std::numeric_limits<int32_t>::max())
    {
        throw InvalidArgumentError(fmt::format("{}: one slot of every state tensor is {} chunks of {} bytes; one "
                                               "launch's grid holds at most {}",
            kWHAT, chunks, detail::kSTATE_COPY_CHUNK_BYTES, std::numeric_limits<int32_t>::max()));
    }
    int32_t numTensors = 0;
    for (StateLayerLayout const& layer : layout.stateLayers)
    {
        numTensors += static_cast<int32_t>(layer.tensors.size());
    }
    int64_t const bytesPerCopy = layout.stateBytesPerSlot;
    detail::StateCopyParams const params{detail::KVCacheManagerInternal::stateTable(cache), numTensors};
    for (int32_t first = 0; first < count; first += kMAX_INLINE_STATE_COPIES)
    {
        int32_t const part = std::min(kMAX_INLINE_STATE_COPIES, count - first);
        bool const keepSources = detail::keepsSourcesInL2(bytesPerCopy, part);
        if (part <= detail::kSMALL_INLINE_LIST)
        {
            detail::launch(params, keepSources, chunks,
                detail::makeInlineList<detail::kSMALL_INLINE_LIST>(copies + first, part), part, stream);
        }
        else
        {
            detail::launch(params, keepSources, chunks,
                detail::makeInlineList<kMAX_INLINE_STATE_COPIES>(copies + first, part), part, stream);
        }
    }
}

void copyStates(KVCacheManager const& cache, std::vector<StateSlotCopy> const& copies, cudaStream_t stream)
{
    copyStates(cache, copies.data(), detail::listCount("copyStates", copies), stream);
}

} // namespace kvcache::rt
