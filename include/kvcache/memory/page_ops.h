#pragma once

#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! A page id that device-resident lists may hold as padding; the kernels skip it.
inline constexpr int32_t kUNUSED_PAGE_ENTRY = -1;

//! Copy page `src` onto page `dst` (same id space: [0, numPages) of the targeted group's pools).
struct PageCopy
{
    int32_t src;
    int32_t dst;
};

//! One page moved between the cache and the host tier (kvcache/tiers/host_tier.h): device page `page` of the tier's
//! group and host page `hostPage`. Device-resident lists may hold kUNUSED_PAGE_ENTRY (-1) in either field as padding;
//! the kernel skips the entry.
struct HostTierEntry
{
    int32_t page;
    int32_t hostPage;
};

//! A copy of one sequence's state, in every state layer and tensor, from state slot `src` to state slot `dst`
//! (kvcache/core/kv_cache_layout.h: a slot index means the same sequence in every state layer). PageManager queues
//! them for forks (StepCopies::stateCopies()); copyStates runs them.
struct StateSlotCopy
{
    int32_t src;
    int32_t dst;
};

//! Which half of each layer a page operation touches.
enum class KVHalf : int32_t
{
    kBOTH = 0,
    kK = 1,
    kV = 2,
};

//! The page group, layers and halves a page operation touches. Page ids index the group's pools; layers are
//! positions in the group's layer list (KVCacheManager::group(g).layers): [firstLayer, firstLayer + numLayers), which
//! for a one-group cache are the layer indices themselves. numLayers 0 makes the call a no-op. A group, firstLayer or
//! numLayers outside the cache's throws InvalidArgumentError, and so does group -1 on a cache of several groups (a page
//! id means nothing across groups). Latent layers have no V half: kV skips them, kBOTH touches their one half.
struct PageOpTarget
{
    int32_t firstLayer = 0;
    //! -1 means every layer of the group from firstLayer on.
    int32_t numLayers = -1;
    KVHalf half = KVHalf::kBOTH;
    //! The page group; -1 means the only one.
    int32_t group = -1;
};

//! A page is its data and, in a cache with scale pools (KVQuantization kFP8_PER_TOKEN_HEAD, kNVFP4), its scales: every
//! operation below moves or fills a targeted layer half's scale page with its data page, in a second launch over the
//! same list (so the launch counts below double for such a cache). Host-held scales (KVCacheManager::layerScales) are
//! per layer, not per page, and page operations leave them alone.

//! Copies each pair's source page onto its destination page in every targeted layer and half, in one kernel
//! launch per kMAX_INLINE_PAGE_OPS pairs, stream-ordered on `stream`; never synchronises or allocates.
//! A copy that writes more than 32 MiB reads its sources at L2 priority evict_last and gives each line normal priority
//! back once copied, so it leaves no persisting lines in the L2 (docs/benchmarks.md says why it helps).
//! The list travels as kernel parameters, so the call may be captured in a CUDA graph.
//! Throws (before launching anything) OutOfRangeError for an id outside [0, numPages) and InvalidArgumentError for
//! a destination listed twice, a page that is both a source and a destination, a bad target, a negative count or
//! a null list with a positive count. Zero pairs is a no-op.
void copyPages(KVCacheManager const& cache, PageCopy const* pairs, int32_t count, cudaStream_t stream,
    PageOpTarget const& target = {});
//! As above, for a std::vector of pairs.
void copyPages(KVCacheManager const& cache, std::vector<PageCopy> const& pairs, cudaStream_t stream,
    PageOpTarget const& target = {});

//! Copies pages listed in device memory, in one launch on `stream` (one per kMAX_DEVICE_PAGE_OPS_PER_LAUNCH entries of
//! capacity). `devicePairs` must hold `capacity` entries. The kernel reads
//! `*deviceCount` pairs (all `capacity` when it is nullptr; the count is clamped to capacity), so a graph that
//! captured this call replays with whatever the lists hold then. Pairs with a kUNUSED_PAGE_ENTRY id are skipped;
//! any other id outside [0, numPages) is never dereferenced and, when `deviceErrorCount` is given, adds one to it
//! (once per bad pair, whatever the number of targeted layers and halves, scale pages included). A negative device
//! count counts as 0.
//! Overlapping sources and destinations are the caller's to avoid (the result is then unspecified). Throws, before
//! launching, for a bad target, a negative capacity or a null list with a positive capacity.
void copyPagesDevice(KVCacheManager const& cache, PageCopy const* devicePairs, int32_t capacity,
    int32_t const* deviceCount, cudaStream_t stream, PageOpTarget const& target = {},
    int32_t* deviceErrorCount = nullptr);

//! Fills each listed page with the little-endian 4-byte `pattern`, counted from the start of each page (0 clears
//! it; 0x7E007E00 is a float16 NaN),
//! in every targeted layer and half, stream-ordered on `stream`. Scale pages get the same pattern counted from the
//! start of each scale page: 0 gives zero scales, which read back as zeros whatever the data (docs/layout.md). Throws
//! OutOfRangeError for an id outside [0, numPages) and InvalidArgumentError for a page listed twice or a bad target,
//! before launching anything.
void resetPages(KVCacheManager const& cache, int32_t const* pages, int32_t count, cudaStream_t stream,
    uint32_t pattern = 0, PageOpTarget const& target = {});
//! As above, for a std::vector of page ids.
void resetPages(KVCacheManager const& cache, std::vector<int32_t> const& pages, cudaStream_t stream,
    uint32_t pattern = 0, PageOpTarget const& target = {});

//! Resets pages listed in device memory, with the same count, skipping and error-counting rules as
//! copyPagesDevice.
void resetPagesDevice(KVCacheManager const& cache, int32_t const* devicePages, int32_t capacity,
    int32_t const* deviceCount, cudaStream_t stream, uint32_t pattern = 0, PageOpTarget const& target = {},
    int32_t* deviceErrorCount = nullptr);

//! Copies each listed sequence state from slot `src` to slot `dst` in every state layer and every tensor of it
//! (KVCacheManager::stateView: slot n of a tensor is its slotBytes bytes at n * slotBytes), all copies and all state
//! layers in one kernel launch per kMAX_INLINE_STATE_COPIES copies, stream-ordered on `stream`; never synchronises or
//! allocates. The list travels as kernel parameters, so the call may be captured in a CUDA graph. A copy that writes
//! more than 32 MiB reads its sources at L2 priority evict_last, as copyPages does. Throws, before launching anything:
//! InvalidArgumentError for a negative count, a null list with a positive count or a cache without state layers with
//! a positive count; OutOfRangeError for a slot outside [0, numStateSlots); InvalidArgumentError for a destination
//! listed twice or a slot that is both a source and a destination. Zero copies is a no-op.
void copyStates(KVCacheManager const& cache, StateSlotCopy const* copies, int32_t count, cudaStream_t stream);
//! As above, for a std::vector of copies (StepCopies::stateCopies(), PageManager::pendingStateCopies()).
void copyStates(KVCacheManager const& cache, std::vector<StateSlotCopy> const& copies, cudaStream_t stream);

//! Host-listed pages one launch carries as kernel parameters; longer lists take several launches.
inline constexpr int32_t kMAX_INLINE_PAGE_OPS = 256;
//! State copies one copyStates launch carries as kernel parameters; longer lists take several launches.
inline constexpr int32_t kMAX_INLINE_STATE_COPIES = 256;
//! Device-list entries one launch covers (CUDA's grid limit); longer lists take several launches.
inline constexpr int32_t kMAX_DEVICE_PAGE_OPS_PER_LAUNCH = 65535;

} // namespace kvcache::rt
