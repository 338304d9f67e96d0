#pragma once

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"
#include "kvcache/dist/tensor_parallel.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt
{

class KVCacheManager;

//! One contiguous range of memory as a transfer library names it (NIXL's address, length and device id).
struct MemoryRange
{
    uint64_t address = 0;
    uint64_t bytes = 0;
    int32_t device = 0; //!< the CUDA device ordinal
};

//! One layer of a page group as a transfer sees it: which of the model's heads the cache holds, and its host-held
//! scales.
struct TransferLayer
{
    //! The model head this cache's head 0 is (TensorParallelLayerShard::firstHead; 0 without tensor parallelism).
    int32_t firstHead = 0;
    //! Ranks holding these same heads (TensorParallelLayerShard::replicas; 1 without tensor parallelism).
    int32_t replicas = 1;
    //! The layer's host-held scales (KVCacheManager::layerScales); read only for quantizations that keep them.
    LayerScales hostScales = {};
};

//! One page group of a cache as a transfer sees it.
struct TransferGroup
{
    PageGeometry geometry = {};
    //! Pages of each half of each of the group's layers.
    int32_t numPages = 0;
    //! One entry per layer of geometry.layers.
    std::vector<TransferLayer> layers = {};
    //! Per part of a page, in the order a page holds them (each layer's data in layer order, then each layer's page
    //! scales for kFP8_PER_TOKEN_HEAD and kNVFP4), the address of that part's K pool. A part's V pool follows its K
    //! pool: it starts numPages times the part's bytes per page half later.
    std::vector<uint64_t> poolBases = {};
};

//! One tensor of a state layer as a transfer sees it: slot n's state is slotBytes bytes at base + n * slotBytes.
struct TransferStateTensor
{
    uint64_t base = 0; //!< the address of slot 0
    DataType dataType = DataType::kFLOAT;
    std::vector<int64_t> shape = {}; //!< one slot's extents (StateTensorConfig::shape)
    int64_t slotBytes = 0;           //!< the product of shape times the element size
};

//! One state layer as a transfer sees it: its tensors in config order.
struct TransferStateLayer
{
    std::vector<TransferStateTensor> tensors = {};
};

//! What one side of a transfer holds and where: its device, its tensor-parallel position, per page group its
//! geometry, pool addresses and host-held scales, and its state layers' slots. Each side sends its own
//! (encodeTransferDescription) before any page moves; the side that moves pages builds both sides' ranges from the
//! two.
struct TransferDescription
{
    int32_t device = 0;
    int32_t tp = 1;   //!< ranks in the cache's tensor-parallel group
    int32_t rank = 0; //!< this cache's rank, in [0, tp)
    std::vector<TransferGroup> groups = {};
    //! Slots of each state layer (KVCacheLayout::numStateSlots); 0 without state layers.
    int32_t numStateSlots = 0;
    std::vector<TransferStateLayer> stateLayers = {};
};

//! Returns the description of `cache`: its device, pools and host-held scales, and the heads `shard` says it holds
//! (null: the whole model, tp 1). Throws InvalidArgumentError when the shard's config has another number of layers or
//! another head count than the cache.
TransferDescription describeForTransfer(KVCacheManager const& cache, TensorParallelShard const* shard = nullptr);

//! Returns the description of a cache of `layout` whose pools start at `poolBases` (per group in order, per part of
//! its page in TransferGroup::poolBases' order, then per state layer the start of its allocation, its tensors at
//! their StateTensorLayout::offsetBytes), on `device`, with `hostScales` (one per layer of the layout, or empty for
//! the defaults) and the heads `shard` says it holds (null: the whole model). This is what the other overload builds
//! from a manager; it needs no GPU. Throws InvalidArgumentError naming the field for a base count that does not match
//! the layout, a scale count that does not match its layers, or a shard that does not match it.
TransferDescription describeForTransfer(KVCacheLayout const& layout, std::vector<uint64_t> const& poolBases,
    int32_t device, std::vector<LayerScales> const& hostScales = {}, TensorParallelShard const* shard = nullptr);

//! Returns `description` as bytes, little-endian: the magic "KVTD", version 2, then every field in declaration order
//! (docs/transfer_descriptors.md). Version 2 added the state layers at the end; decodeTransferDescription reads both.
std::vector<uint8_t> encodeTransferDescription(TransferDescription const& description);

//! Returns the description `bytes[0, size)` encode. Throws InvalidArgumentError naming what is wrong for bytes that do
//! not start with the magic, another version, a count out of its range or bytes that end early or run on.
TransferDescription decodeTransferDescription(uint8_t const* bytes, size_t size);

//! Returns the memory a transfer library must register to move `description`'s pages and states: per group, per
//! part, one range from its K pool's first byte to its V pool's last; then per state layer one range from its first
//! tensor's first slot to its last tensor's last slot.
std::vector<MemoryRange> registrationRanges(TransferDescription const& description);

//! Returns "" when pages of group `group` can move between `local` and `remote`, else the first reason they cannot,
//! naming the field and both values: a group outside either side's groups, a geometry that differs in anything but
//! the page size and the heads held (data type, quantization, window, layers, each layer's kind, head size and the
//! model's head count), page sizes of which neither is a whole multiple of the other, or host-held scales whose bits
//! differ.
std::string transferMismatch(TransferDescription const& local, TransferDescription const& remote, int32_t group);

//! The ranges of one transfer between the local cache and one remote cache: local[i] and remote[i] have the same
//! bytes. Ranges are in one order: layer by layer in the group's order; within a layer, its parts as a page holds
//! them (data, then page scales); within a part, its K half, then its V half; within a half, token order. Ranges
//! adjacent on both sides are merged.
struct TransferDescriptors
{
    std::vector<MemoryRange> local = {};
    std::vector<MemoryRange> remote = {};
    //! Per layer of the group, the end of its ranges: layer l's ranges are [layerEnds[l - 1], layerEnds[l]) (from 0
    //! for layer 0), so a transfer can be split by layer and each layer waited on.
    std::vector<int64_t> layerEnds = {};
};

//! Returns, per remote in `remotes`, the ranges that move tokens [0, numTokens) of one sequence in group `group`
//! between the remote's pages `remotePages[0, numRemotePages)` and the local pages `localPages[0, numLocalPages)`, each
//! list in its own cache's page size, as PageManager::pages gives them (kUNUSED_PAGE_ENTRY for pages a window released:
//! the tokens of such a page move nowhere). The ranks of one tensor-parallel group hold the same page ids, so one
//! remote page list serves every remote.
//!
//! Tokens move in runs of the smaller page size, whole runs, so the last run may carry bytes past numTokens into the
//! local page (bytes no one has read yet). Page sizes may differ by a whole factor. Heads may be split differently
//! (tensor parallelism): each head the local cache holds comes from the first remote in `remotes` that holds it; a
//! head slice narrower than a page half's tokens is one range per token. Throws InvalidArgumentError with
//! transferMismatch's reason, for no remotes, a local head no remote holds, null lists with nonzero counts, fewer
//! pages than numTokens needs on either side or a negative numTokens, and OutOfRangeError naming the list, the index
//! and the page for a page id outside [0, numPages) that is not kUNUSED_PAGE_ENTRY.
std::vector<TransferDescriptors> transferDescriptors(TransferDescription const& local, int32_t const* localPages,
    int32_t numLocalPages, std::vector<TransferDescription> const& remotes, int32_t const* remotePages,
    int32_t numRemotePages, int32_t group, int32_t numTokens);

//! `count` descriptors of `bytes` each, back to back from `address` on `device`: one run of a prepared descriptor list
//! (NIXL's strided rows (address, bytes, device, stride, count) with stride equal to bytes).
struct DescriptorBlock
{
    uint64_t address = 0;
    uint64_t bytes = 0;
    int32_t device = 0;
    int64_t count = 0;
};

//! One side's pages of one group as a prepared descriptor list: one descriptor per tokensPerDescriptor tokens of each
//! page half, in the order of transferDescriptors' ranges. blocks holds, per layer in the group's order, per part of
//! the layer (data, then page scales), per half (K, then V), one block of numPages * descriptorsPerPage descriptors:
//! descriptor page * descriptorsPerPage + s of a block is tokens [s, s + 1) * tokensPerDescriptor of page `page`.
struct PreparedDescriptors
{
    std::vector<DescriptorBlock> blocks = {};
    //! Per layer of the group, the end of its blocks: layer l's are [layerEnds[l - 1], layerEnds[l]) (from 0 for l 0).
    std::vector<int64_t> layerEnds = {};
    int32_t numPages = 0;
    int32_t descriptorsPerPage = 0; //!< tokensPerPage / tokensPerDescriptor
};

//! Returns the prepared descriptor list of group `group` of `description`, tokensPerDescriptor tokens a descriptor.
//! Throws OutOfRangeError for a group outside the description's groups and InvalidArgumentError, naming both values,
//! for a tokensPerDescriptor < 1 or one that does not divide the group's tokensPerPage.
PreparedDescriptors preparedDescriptors(
    TransferDescription const& description, int32_t group, int32_t tokensPerDescriptor);

//! How group `group`'s pages move between the local cache and `remotes` through prepared descriptor lists.
struct PreparedPlan
{
    //! The smaller of the two sides' page sizes: both sides' lists use it (preparedDescriptors).
    int32_t tokensPerDescriptor = 0;
    //! Per layer of the group, the remote in `remotes` it comes from whole (every local head of the layer from that
    //! remote, which holds exactly those heads), or -1 when its heads come in slices (tensor-parallel layouts that
    //! differ): such a layer needs one range per token, which only transferDescriptors gives.
    std::vector<int32_t> layerSources = {};
};

//! Returns the plan for moving group `group`'s pages between `local` and `remotes`, each head taken from the first
//! remote that holds it (as transferDescriptors takes them). Throws what transferDescriptors throws for the
//! descriptions: InvalidArgumentError with transferMismatch's reason, for no remotes, remotes of different page sizes
//! or a local head no remote holds.
PreparedPlan preparedPlan(
    TransferDescription const& local, std::vector<TransferDescription> const& remotes, int32_t group);

//! Returns "" when state slots can move between `local` and `remote`, else the first reason they cannot, naming the
//! field and both values: another tensor-parallel size or rank (a rank's state layers hold that rank's heads, so each
//! rank moves its own), another number of state layers, of tensors in a layer, or a tensor of another data type or
//! shape.
std::string stateTransferMismatch(TransferDescription const& local, TransferDescription const& remote);

//! Returns the ranges that move the states of `count` sequences, every state layer and tensor, from the remote's
//! slots `remoteSlots[i]` to the local slots `localSlots[i]` (or back: local[j] and remote[j] have the same bytes).
//! Ranges are in one order: state layer by state layer, within a layer tensor by tensor, within a tensor pair by pair;
//! ranges adjacent on both sides are merged. layerEnds gives the end of each state layer's ranges. Throws
//! InvalidArgumentError with stateTransferMismatch's reason, for a negative count or null lists with count > 0, and
//! OutOfRangeError naming the list, the index and the slot for a slot outside [0, numStateSlots).
TransferDescriptors stateTransferDescriptors(TransferDescription const& local, int32_t const* localSlots,
    TransferDescription const& remote, int32_t const* remoteSlots, int32_t count);

//! Returns the state slots of `description` as a prepared descriptor list: per state layer, per tensor, one block of
//! numStateSlots descriptors of the tensor's slotBytes, so descriptor n of a block is slot n. numPages is
//! numStateSlots and descriptorsPerPage 1; layerEnds gives the end of each state layer's blocks. Empty without state
//! layers.
PreparedDescriptors preparedStateDescriptors(TransferDescription const& description);

} // namespace kvcache::rt
