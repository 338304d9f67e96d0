// The state copy: every listed slot copy, in every state tensor of every state layer, in one launch per 128 state
// tensors.

#include "device/page_lists.cuh"
#include "device/page_mover.cuh"
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

//! Bytes of the chunks a state copy splits each state tensor's slot into: one block moves one chunk.
constexpr int64_t kSTATE_COPY_CHUNK_BYTES = int64_t{32} << 10;
//! State tensors one launch copies. Their entries are kernel parameters (3 KiB with the count).
constexpr int32_t kMAX_LAUNCH_STATE_TENSORS = 128;

static_assert(
    WideShape::kCHUNK_BYTES == kSTATE_COPY_CHUNK_BYTES && NarrowShape::kCHUNK_BYTES == kSTATE_COPY_CHUNK_BYTES,
    "the state tensors' chunks are numbered for both block shapes");
static_assert(kMAX_INLINE_STATE_COPIES <= kMAX_GRID_YZ, "one launch's copies must fit its grid");

// Short lists travel in a small parameter block: a launch copies its whole parameter block.
constexpr int32_t kSMALL_INLINE_LIST = 32;

//! Returns the kSTATE_COPY_CHUNK_BYTES chunks of a state tensor slot of `slotBytes` bytes.
constexpr int64_t stateSlotChunks(int64_t slotBytes)
{
    return (slotBytes + kSTATE_COPY_CHUNK_BYTES - 1) / kSTATE_COPY_CHUNK_BYTES;
}

//! One state tensor as the kernel reads it: slot n is slotBytes bytes at base + n * slotBytes.
struct StateTensor
{
    char* base;         //!< the tensor's start: its layer's allocation plus offsetBytes
    int64_t slotBytes;  //!< one slot of the tensor
    int64_t firstChunk; //!< the chunks of one slot of the launch's tensors before it
};

//! The state tensors of one launch, in layer then tensor order, as its parameters: a block searches them in the
//! constant bank, which each launch fills, so its first loads do not wait on a table that earlier copies pushed out of
//! L2.
struct StateTensors
{
    StateTensor tensors[kMAX_LAUNCH_STATE_TENSORS];
    int32_t count;
    int64_t chunks; //!< of one slot of all `count` tensors: the grid's x
};

//! Grid: x = chunk of one slot of the launch's state tensors (StateTensor::firstChunk numbers them), y = copy. Every
//! block has bytes to move: chunks are numbered tensor by tensor, so no block idles on a small tensor beside a large
//! one. KEEP_SOURCES: read sources at L2 priority evict_last (see CacheGlobalAccess); a template argument, as a
//! run-time flag made the narrow kernel spill registers.
template <typename Shape, bool KEEP_SOURCES, typename List>
__global__ void __launch_bounds__(Shape::kTHREADS)
    stateCopyKernel(StateTensors const __grid_constant__ state, List list)
{
    auto const chunk = static_cast<int64_t>(blockIdx.x);
    // The tensor of this chunk: the last whose firstChunk is at most `chunk` (the first tensor's is 0).
    int32_t low = 0;
    int32_t high = state.count - 1;
    while (low < high)
    {
        int32_t const middle = (low + high + 1) / 2;
        if (state.tensors[middle].firstChunk <= chunk)
        {
            low = middle;
        }
        else
        {
            high = middle - 1;
        }
    }
    StateTensor const& tensor = state.tensors[low];
    int64_t const chunkStart = (chunk - tensor.firstChunk) * Shape::kCHUNK_BYTES;
    StateSlotCopy const copy = list[static_cast<int32_t>(blockIdx.y)];
    int64_t const bytes = min(Shape::kCHUNK_BYTES, tensor.slotBytes - chunkStart);
    char const* const src = tensor.base + copy.src * tensor.slotBytes + chunkStart;
    char* const dst = tensor.base + copy.dst * tensor.slotBytes + chunkStart;
    // Tensors start 256-byte aligned; a slot size that is not a multiple of 16 bytes leaves some slots unaligned, and
    // those (and a tensor's last chunk when its bytes are not whole vectors) move byte by byte.
    bool const vectorised =
        ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(bytes))
            % kVECTOR_BYTES)
        == 0;
    moveChunk<Shape>(src, dst, bytes, vectorised, CacheGlobalAccess{KEEP_SOURCES}, static_cast<int32_t>(threadIdx.x));
}

template <typename Shape, typename List>
void launchShaped(StateTensors const& state, bool keepSources, List const& list, int32_t count, cudaStream_t stream)
{
    dim3 const grid(static_cast<uint32_t>(state.chunks), static_cast<uint32_t>(count));
    if (keepSources)
    {
        stateCopyKernel<Shape, true, List><<<grid, Shape::kTHREADS, 0, stream>>>(state, list);
    }
    else
    {
        stateCopyKernel<Shape, false, List><<<grid, Shape::kTHREADS, 0, stream>>>(state, list);
    }
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

template <typename List>
void launch(StateTensors const& state, bool keepSources, List const& list, int32_t count, cudaStream_t stream)
{
    // Every block of the grid moves bytes, so the page copy's rule for grids without idle blocks applies.
    if (wideBlocksPay(state.chunks * count))
    {
        launchShaped<WideShape>(state, keepSources, list, count, stream);
    }
    else
    {
        launchShaped<NarrowShape>(state, keepSources, list, count, stream);
    }
}

//! Launches every copy of `copies` over the tensors in `state`, kMAX_INLINE_STATE_COPIES copies a launch.
void launchCopies(
    StateTensors const& state, int64_t bytesPerCopy, StateSlotCopy const* copies, int32_t count, cudaStream_t stream)
{
    for (int32_t first = 0; first < count; first += kMAX_INLINE_STATE_COPIES)
    {
        int32_t const part = std::min(kMAX_INLINE_STATE_COPIES, count - first);
        bool const keepSources = keepsSourcesInL2(bytesPerCopy, part);
        if (part <= kSMALL_INLINE_LIST)
        {
            launch(state, keepSources, makeInlineList<kSMALL_INLINE_LIST>(copies + first, part), part, stream);
        }
        else
        {
            launch(state, keepSources, makeInlineList<kMAX_INLINE_STATE_COPIES>(copies + first, part), part, stream);
        }
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
    int64_t chunks = 0;
    for (StateLayerLayout const& layer : layout.stateLayers)
    {
        for (StateTensorLayout const& tensor : layer.tensors)
        {
            chunks += detail::stateSlotChunks(tensor.slotBytes);
        }
    }
    // CUDA's limit on a grid's x dimension: a slot of over 64 TiB. Checked for all the tensors before any launch.
    if (chunks > std::numeric_limits<int32_t>::max())
    {
        throw InvalidArgumentError(fmt::format("{}: one slot of every state tensor is {} chunks of {} bytes; one "
                                               "launch's grid holds at most {}",
            kWHAT, chunks, detail::kSTATE_COPY_CHUNK_BYTES, std::numeric_limits<int32_t>::max()));
    }
    // The L2 hint follows what the whole list writes, over all its launches.
    int64_t const bytesPerCopy = layout.stateBytesPerSlot;
    detail::StateTensors state{};
    for (int32_t l = 0; l < cache.numStateLayers(); ++l)
    {
        auto* const base = static_cast<char*>(cache.statePtr(l));
        for (StateTensorLayout const& tensor : layout.stateLayers[static_cast<size_t>(l)].tensors)
        {
            if (state.count == detail::kMAX_LAUNCH_STATE_TENSORS)
            {
                detail::launchCopies(state, bytesPerCopy, copies, count, stream);
                state = detail::StateTensors{};
            }
            state.tensors[state.count] = detail::StateTensor{base + tensor.offsetBytes, tensor.slotBytes, state.chunks};
            ++state.count;
            state.chunks += detail::stateSlotChunks(tensor.slotBytes);
        }
    }
    detail::launchCopies(state, bytesPerCopy, copies, count, stream);
}

void copyStates(KVCacheManager const& cache, std::vector<StateSlotCopy> const& copies, cudaStream_t stream)
{
    copyStates(cache, copies.data(), detail::listCount("copyStates", copies), stream);
}

} // namespace kvcache::rt
