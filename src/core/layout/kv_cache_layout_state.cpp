// The state layers' part of computeLayout: each state tensor's slot and pool, the layers' tensors aligned one after the
// other, and the slots of running sequences and checkpoints.
#include "core/layout/kv_cache_layout_internal.h"

#include <limits>
#include <string>
#include <utility>

namespace kvcache::rt::detail
{
namespace
{

//! Validates the state tensor `tensor` of state layer `layerIndex` (tensor `tensorIndex`) and returns its layout for
//! `numSlots` slots, offsetBytes aside.
StateTensorLayout stateTensorLayout(
    StateTensorConfig const& tensor, size_t layerIndex, size_t tensorIndex, int32_t numSlots)
{
    std::string const field = fmt::format("KVCacheConfig.stateLayerConfigs[{}].tensors[{}]", layerIndex, tensorIndex);
    if (tensor.name.empty())
    {
        throw InvalidConfigError(fmt::format("{}.name is empty; a state tensor needs a name", field));
    }
    int64_t const elementBytes = dataTypeSize(tensor.dataType);
    if (elementBytes == 0)
    {
        throw InvalidConfigError(fmt::format("{}.dataType (tensor \"{}\") is {}, which is not a DataType value", field,
            tensor.name, static_cast<int32_t>(tensor.dataType)));
    }
    if (tensor.shape.empty() || tensor.shape.size() > static_cast<size_t>(kMAX_STATE_DIMS))
    {
        throw InvalidConfigError(fmt::format("{}.shape (tensor \"{}\") has {} dimensions; it must have 1 to {} "
                                             "(kMAX_STATE_DIMS)",
            field, tensor.name, tensor.shape.size(), kMAX_STATE_DIMS));
    }
    StateTensorLayout layout;
    layout.name = tensor.name;
    layout.shape = tensor.shape;
    layout.dataType = tensor.dataType;
    layout.slotElems = 1;
    std::string const what = fmt::format("state layer {} tensor \"{}\" ", layerIndex, tensor.name);
    for (size_t d = 0; d < tensor.shape.size(); ++d)
    {
        if (tensor.shape[d] <= 0)
        {
            throw InvalidConfigError(fmt::format(
                "{}.shape[{}] (tensor \"{}\") is {}; it must be > 0", field, d, tensor.name, tensor.shape[d]));
        }
        layout.slotElems = checkedMul(layout.slotElems, tensor.shape[d], what + "elements per slot");
    }
    checkStateSplit(tensor, field);
    layout.slotBytes = checkedMul(layout.slotElems, elementBytes, what + "bytes per slot");
    layout.bytes = checkedMul(numSlots, layout.slotBytes, what + "bytes");
    return layout;
}

} // namespace

void checkStateSplit(StateTensorConfig const& tensor, std::string const& field)
{
    auto const dims = static_cast<int64_t>(tensor.shape.size());
    if (tensor.splitDim < -1 || tensor.splitDim >= dims)
    {
        throw InvalidConfigError(fmt::format("{}.splitDim (tensor \"{}\") is {}; it must be -1 (whole on every rank) or "
                                             "a dimension of its shape, in [0, {})",
            field, tensor.name, tensor.splitDim, dims));
    }
    if (tensor.splitDim == -1)
    {
        if (!tensor.splitSegments.empty())
        {
            throw InvalidConfigError(fmt::format("{}.splitSegments (tensor \"{}\") has {} segments, but splitDim is -1 "
                                                 "(whole on every rank); it must be empty, or splitDim name the "
                                                 "dimension they divide",
                field, tensor.name, tensor.splitSegments.size()));
        }
        return;
    }
    if (tensor.splitSegments.empty())
    {
        return;
    }
    std::string const what = fmt::format("{} (tensor \"{}\") split entries", field, tensor.name);
    int64_t spanned = 0;
    for (size_t s = 0; s < tensor.splitSegments.size(); ++s)
    {
        StateSplitSegment const& segment = tensor.splitSegments[s];
        if (segment.parts < 1 || segment.partSize < 1)
        {
            bool const parts = segment.parts < 1;
            throw InvalidConfigError(fmt::format("{}.splitSegments[{}].{} (tensor \"{}\") is {}; it must be > 0", field,
                s, parts ? "parts" : "partSize", tensor.name, parts ? segment.parts : segment.partSize));
        }
        spanned = checkedAdd(spanned, checkedMul(segment.parts, segment.partSize, what), what);
    }
    int64_t const extent = tensor.shape[static_cast<size_t>(tensor.splitDim)];
    if (spanned != extent)
    {
        throw InvalidConfigError(fmt::format("{}.splitSegments (tensor \"{}\") span {} entries (parts x partSize, "
                                             "added up); they must span shape[{}] = {} exactly",
            field, tensor.name, spanned, tensor.splitDim, extent));
    }
}

void addStateLayers(KVCacheConfig const& config, KVCacheLayout& layout)
{
    if (config.numCheckpointSlots < 0)
    {
        throw InvalidConfigError(
            fmt::format("KVCacheConfig.numCheckpointSlots is {}; it must be >= 0", config.numCheckpointSlots));
    }
    layout.numCheckpointSlots = config.numCheckpointSlots;
    if (config.stateLayerConfigs.empty())
    {
        if (config.numCheckpointSlots != 0)
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.numCheckpointSlots is {}; it must be 0 for a config "
                                                 "without state layers (stateLayerConfigs is empty)",
                config.numCheckpointSlots));
        }
        return;
    }
    int64_t const numSlots = int64_t{config.maxBatchSize} + config.numCheckpointSlots;
    if (numSlots > std::numeric_limits<int32_t>::max())
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.numCheckpointSlots is {}; maxBatchSize ({}) + "
                                             "numCheckpointSlots = {} state slots exceeds the int32 limit {}",
            config.numCheckpointSlots, config.maxBatchSize, numSlots, std::numeric_limits<int32_t>::max()));
    }
    layout.numStateSlots = static_cast<int32_t>(numSlots);
    layout.stateLayers.reserve(config.stateLayerConfigs.size());
    for (size_t i = 0; i < config.stateLayerConfigs.size(); ++i)
    {
        StateLayerConfig const& layerConfig = config.stateLayerConfigs[i];
        if (layerConfig.tensors.empty())
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.stateLayerConfigs[{}].tensors is empty; a state layer "
                                                 "needs at least one state tensor",
                i));
        }
        std::string const where = fmt::format("state layer {} ", i);
        StateLayerLayout layer;
        for (size_t t = 0; t < layerConfig.tensors.size(); ++t)
        {
            StateTensorLayout tensor = stateTensorLayout(layerConfig.tensors[t], i, t, layout.numStateSlots);
            for (size_t earlier = 0; earlier < t; ++earlier)
            {
                if (layerConfig.tensors[earlier].name == tensor.name)
                {
                    throw InvalidConfigError(fmt::format("KVCacheConfig.stateLayerConfigs[{}].tensors[{}].name is "
                                                         "\"{}\", the name of tensors[{}]; names must be unique "
                                                         "within a layer",
                        i, t, tensor.name, earlier));
                }
            }
            int64_t const padded = checkedAdd(layer.layerBytes, kSTATE_TENSOR_ALIGNMENT - 1, where + "bytes");
            tensor.offsetBytes = padded / kSTATE_TENSOR_ALIGNMENT * kSTATE_TENSOR_ALIGNMENT;
            layer.layerBytes = checkedAdd(tensor.offsetBytes, tensor.bytes, where + "bytes");
            layer.slotBytes = checkedAdd(layer.slotBytes, tensor.slotBytes, where + "bytes per slot");
            layer.tensors.push_back(std::move(tensor));
        }
        layout.stateBytesPerSlot = checkedAdd(layout.stateBytesPerSlot, layer.slotBytes, "state bytes per slot");
        layout.stateBytes = checkedAdd(layout.stateBytes, layer.layerBytes, "total state bytes");
        layout.stateLayers.push_back(std::move(layer));
    }
}

} // namespace kvcache::rt::detail
