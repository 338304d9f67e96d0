#include "bindings.h"
#include "cuda_arguments.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/dist/tensor_parallel.h>
#include <kvcache/dist/transfer_descriptors.h>

#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvcache::python
{
namespace
{

using RangeArray = nb::ndarray<nb::numpy, int64_t, nb::shape<-1, 3>>;
using EndArray = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;
using BlockArray = nb::ndarray<nb::numpy, int64_t, nb::shape<-1, 5>>;

//! Decodes the description bytes `value` (argument `field`).
rt::TransferDescription description(nb::handle value, char const* field)
{
    std::string const bytes = bytesArgument(value, field, "bytes (a transfer description)");
    return rt::decodeTransferDescription(reinterpret_cast<uint8_t const*>(bytes.data()), bytes.size());
}

//! Returns `ranges` as an [n, 3] int64 NumPy array of (address, bytes, device) rows, the form NIXL's descriptor
//! lists take.
RangeArray rangeArray(std::vector<rt::MemoryRange> const& ranges)
{
    auto* data = new int64_t[ranges.size() * 3];
    for (size_t i = 0; i < ranges.size(); ++i)
    {
        data[3 * i] = static_cast<int64_t>(ranges[i].address);
        data[3 * i + 1] = static_cast<int64_t>(ranges[i].bytes);
        data[3 * i + 2] = ranges[i].device;
    }
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
    return RangeArray(data, {ranges.size(), size_t{3}}, owner);
}

EndArray endArray(std::vector<int64_t> const& ends)
{
    auto* data = new int64_t[ends.size()];
    std::copy(ends.begin(), ends.end(), data);
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
    return EndArray(data, {ends.size()}, owner);
}

//! Returns `blocks` as an [n, 5] int64 NumPy array of (address, bytes, device, stride, count) rows, the strided form
//! NIXL's prep_xfer_dlist takes (stride equal to bytes: the descriptors follow each other).
BlockArray blockArray(std::vector<rt::DescriptorBlock> const& blocks)
{
    auto* data = new int64_t[blocks.size() * 5];
    for (size_t i = 0; i < blocks.size(); ++i)
    {
        data[5 * i] = static_cast<int64_t>(blocks[i].address);
        data[5 * i + 1] = static_cast<int64_t>(blocks[i].bytes);
        data[5 * i + 2] = blocks[i].device;
        data[5 * i + 3] = static_cast<int64_t>(blocks[i].bytes);
        data[5 * i + 4] = blocks[i].count;
    }
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
    return BlockArray(data, {blocks.size(), size_t{5}}, owner);
}

//! Decodes every description of `remotes` (argument "remotes[i]").
std::vector<rt::TransferDescription> descriptions(nb::list remotes)
{
    std::vector<rt::TransferDescription> result;
    for (size_t i = 0; i < nb::len(remotes); ++i)
    {
        std::string const field = fmt::format("remotes[{}]", i);
        result.push_back(description(remotes[i], field.c_str()));
    }
    return result;
}

} // namespace

void bindTransfer(nb::module_& m)
{
    m.def(
        "layout_transfer_description",
        [](rt::KVCacheLayout const& layout, std::vector<uint64_t> const& poolBases, int32_t device,
            std::vector<rt::LayerScales> const& hostScales, std::optional<rt::KVCacheConfig> const& modelConfig,
            int32_t tp, int32_t rank)
        {
            std::optional<rt::TensorParallelShard> shard;
            if (modelConfig.has_value())
            {
                shard = rt::tensorParallelShard(*modelConfig, tp, rank);
            }
            else if (tp != 1 || rank != 0)
            {
                throw rt::InvalidArgumentError(
                    fmt::format("layout_transfer_description: tp is {} and rank {}; with tensor parallelism give "
                                "model_config, the whole model's config, so that the heads this rank holds are known",
                        tp, rank));
            }
            std::vector<uint8_t> const bytes = rt::encodeTransferDescription(
                rt::describeForTransfer(layout, poolBases, device, hostScales, shard.has_value() ? &*shard : nullptr));
            return nb::bytes(reinterpret_cast<char const*>(bytes.data()), bytes.size());
        },
        nb::arg("layout"), nb::arg("pool_bases"), nb::arg("device") = 0,
        nb::arg("host_scales") = std::vector<rt::LayerScales>{}, nb::arg("model_config") = nb::none(),
        nb::arg("tp") = 1, nb::arg("rank") = 0,
        "The transfer description of memory laid out as `layout`'s cache whose pools start at `pool_bases` (per "
        "group, per part of its page: each layer's data, then each layer's page scales; then per state layer the "
        "start of its allocation: the order of transfer_registration's rows), on `device`, with `host_scales` (one per layer, or none) and, for rank "
        "`rank` of `tp` (model_config: the whole model's Config; `layout` is then the rank's), the heads it holds: "
        "what KVCacheManager.transfer_description gives for a cache, for pools the caller allocated itself (e.g. "
        "host memory). Raises InvalidArgumentError for counts that do not match the layout.");
    m.def(
        "transfer_registration",
        [](BytesArgument const& bytes)
        { return rangeArray(rt::registrationRanges(description(bytes, "description"))); },
        nb::arg("description"),
        "The memory a transfer library registers to move the pages of the cache `description` describes "
        "(KVCacheManager.transfer_description): one (address, bytes, device) row per pool, an [n, 3] int64 NumPy "
        "array.");
    m.def(
        "transfer_mismatch",
        [](BytesArgument const& local, BytesArgument const& remote, int32_t group)
        { return rt::transferMismatch(description(local, "local"), description(remote, "remote"), group); },
        nb::arg("local"), nb::arg("remote"), nb::arg("group"),
        "\"\" when pages of `group` can move between the caches the two descriptions describe, else the first "
        "reason they cannot, naming the field and both values.");
    m.def(
        "transfer_descriptors",
        [](BytesArgument const& local, PageIdsArgument const& localPages, nb::list remotes,
            PageIdsArgument const& remotePages, int32_t group, int32_t numTokens)
        {
            rt::TransferDescription const mine = description(local, "local");
            std::vector<rt::TransferDescription> const theirs = descriptions(remotes);
            std::vector<int32_t> localIds;
            std::vector<int32_t> remoteIds;
            hostPageIds(localPages, localIds);
            hostPageIds(remotePages, remoteIds);
            std::vector<rt::TransferDescriptors> const ranges =
                rt::transferDescriptors(mine, localIds.data(), static_cast<int32_t>(localIds.size()), theirs,
                    remoteIds.data(), static_cast<int32_t>(remoteIds.size()), group, numTokens);
            nb::list result;
            for (rt::TransferDescriptors const& r : ranges)
            {
                result.append(nb::make_tuple(rangeArray(r.local), rangeArray(r.remote), endArray(r.layerEnds)));
            }
            return result;
        },
        nb::arg("local"), nb::arg("local_pages"), nb::arg("remotes"), nb::arg("remote_pages"), nb::arg("group"),
        nb::arg("num_tokens"),
        nb::sig(
            "def transfer_descriptors(local: bytes, local_pages: PageIds, remotes: collections.abc.Sequence[bytes], "
            "remote_pages: PageIds, group: int, num_tokens: int) -> list[tuple[NDArray[Any], NDArray[Any], "
            "NDArray[Any]]]"),
        "Per remote description in `remotes`, the ranges that move tokens [0, num_tokens) of one sequence in page "
        "group `group` between the remote pages `remote_pages` and the local pages `local_pages` (each in its own "
        "cache's page size, as PageManager.pages gives them; -1 for pages a window released): a tuple (local, "
        "remote, layer_ends) of two [n, 3] int64 arrays of (address, bytes, device) rows, row i of one moving to "
        "row i of the other, and per layer of the group the end of its rows. Page sizes may differ by a whole "
        "factor and heads by tensor-parallel slices (docs/transfer_descriptors.md). Raises InvalidArgumentError "
        "naming the first mismatch or bad argument, OutOfRangeError for a page id outside the pool.");
    m.def(
        "transfer_prepared_descriptors",
        [](BytesArgument const& bytes, int32_t group, int32_t tokensPerDescriptor)
        {
            rt::PreparedDescriptors const prepared =
                rt::preparedDescriptors(description(bytes, "description"), group, tokensPerDescriptor);
            return nb::make_tuple(blockArray(prepared.blocks), endArray(prepared.layerEnds), prepared.numPages,
                prepared.descriptorsPerPage);
        },
        nb::arg("description"), nb::arg("group"), nb::arg("tokens_per_descriptor"),
        nb::sig("def transfer_prepared_descriptors(description: bytes, group: int, tokens_per_descriptor: int) -> "
                "tuple[NDArray[Any], NDArray[Any], int, int]"),
        "The prepared descriptor list of page group `group` of the cache `description` describes, "
        "`tokens_per_descriptor` tokens a descriptor: a tuple (blocks, layer_ends, num_pages, descriptors_per_page). "
        "blocks is an [n, 5] int64 array of (address, bytes, device, stride, count) rows, the strided form NIXL's "
        "prep_xfer_dlist takes: per layer, per part (data, then page scales), per half (K, then V), num_pages * "
        "descriptors_per_page descriptors, descriptor page * descriptors_per_page + s holding the s-th run of "
        "tokens_per_descriptor tokens of page `page`. layer_ends gives, per layer, the end of its rows. Raises "
        "OutOfRangeError for a group outside the description, InvalidArgumentError for a tokens_per_descriptor that "
        "does not divide the group's tokens per page.");
    m.def(
        "transfer_prepared_plan",
        [](BytesArgument const& local, nb::list remotes, int32_t group)
        {
            rt::PreparedPlan const plan = rt::preparedPlan(description(local, "local"), descriptions(remotes), group);
            return nb::make_tuple(plan.tokensPerDescriptor, plan.layerSources);
        },
        nb::arg("local"), nb::arg("remotes"), nb::arg("group"),
        nb::sig("def transfer_prepared_plan(local: bytes, remotes: collections.abc.Sequence[bytes], group: int) -> "
                "tuple[int, list[int]]"),
        "How page group `group` moves between the local cache and the remote ones through prepared descriptor "
        "lists: a tuple (tokens_per_descriptor, layer_sources). tokens_per_descriptor is the smaller page size, "
        "which both sides' transfer_prepared_descriptors use; layer_sources gives, per layer, the index in "
        "`remotes` of the cache it comes from whole, or -1 where its heads come in tensor-parallel slices (then "
        "only transfer_descriptors' ranges express it). Raises InvalidArgumentError as transfer_descriptors does.");
    m.def(
        "transfer_state_mismatch",
        [](BytesArgument const& local, BytesArgument const& remote)
        { return rt::stateTransferMismatch(description(local, "local"), description(remote, "remote")); },
        nb::arg("local"), nb::arg("remote"),
        "\"\" when state slots can move between the caches the two descriptions describe, else the first reason "
        "they cannot, naming the field and both values: another tensor-parallel size or rank, another number of "
        "state layers or tensors, or a tensor of another data type or shape.");
    m.def(
        "transfer_state_descriptors",
        [](BytesArgument const& local, nb::handle localSlots, BytesArgument const& remote, nb::handle remoteSlots)
        {
            std::vector<int32_t> mine;
            std::vector<int32_t> theirs;
            hostInt32s(localSlots, mine, "local_slots", "slots");
            hostInt32s(remoteSlots, theirs, "remote_slots", "slots");
            if (mine.size() != theirs.size())
            {
                throw rt::InvalidArgumentError(
                    fmt::format("transfer_state_descriptors: local_slots holds {} slots and remote_slots {}; they "
                                "are pairs",
                        mine.size(), theirs.size()));
            }
            rt::TransferDescriptors const ranges = rt::stateTransferDescriptors(description(local, "local"),
                mine.data(), description(remote, "remote"), theirs.data(), static_cast<int32_t>(mine.size()));
            return nb::make_tuple(rangeArray(ranges.local), rangeArray(ranges.remote), endArray(ranges.layerEnds));
        },
        nb::arg("local"), nb::arg("local_slots"), nb::arg("remote"), nb::arg("remote_slots"),
        nb::sig("def transfer_state_descriptors(local: bytes, local_slots: PageIds, remote: bytes, remote_slots: "
                "PageIds) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]"),
        "The ranges that move the states of sequences, every state layer and tensor, between the remote slots "
        "`remote_slots[i]` and the local slots `local_slots[i]`: a tuple (local, remote, layer_ends) of two [n, 3] "
        "int64 arrays of (address, bytes, device) rows, row i of one moving to row i of the other, and per state "
        "layer the end of its rows. Raises InvalidArgumentError naming the mismatch (transfer_state_mismatch) or "
        "the bad argument, OutOfRangeError for a slot outside [0, num_state_slots).");
    m.def(
        "transfer_prepared_state_descriptors",
        [](BytesArgument const& bytes)
        {
            rt::PreparedDescriptors const prepared = rt::preparedStateDescriptors(description(bytes, "description"));
            return nb::make_tuple(blockArray(prepared.blocks), endArray(prepared.layerEnds), prepared.numPages);
        },
        nb::arg("description"),
        nb::sig("def transfer_prepared_state_descriptors(description: bytes) -> tuple[NDArray[Any], NDArray[Any], "
                "int]"),
        "The state slots of the cache `description` describes as a prepared descriptor list: a tuple (blocks, "
        "layer_ends, num_state_slots). blocks is an [n, 5] int64 array of (address, bytes, device, stride, count) "
        "rows, one per state layer and tensor, each of num_state_slots descriptors: descriptor s of a block is slot "
        "s. layer_ends gives, per state layer, the end of its rows. Empty without state layers.");
}

} // namespace kvcache::python
