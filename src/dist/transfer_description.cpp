// Transfer descriptions: what a cache holds and where, as bytes a peer can read, and whether two caches' pages can
// move between them. The parts of a page come from the page anatomy; nothing here writes their order out again.

#include "core/layout/page_anatomy.h"
#include "core/layout/scale_support.h"
#include "dist/transfer_bits.h"
#include "memory/cache/layer_table.h"

#include "kvcache/core/errors.h"
#include "kvcache/dist/transfer_descriptors.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace kvcache::rt
{
namespace
{

constexpr uint32_t kMAGIC = 0x4454564B; // "KVTD" as little-endian bytes
constexpr uint32_t kVERSION = 2;
//! The version before state layers; read as a description without them.
constexpr uint32_t kVERSION_WITHOUT_STATES = 1;

void checkShard(KVCacheLayout const& layout, TensorParallelShard const& shard)
{
    if (shard.layers.size() != layout.layers.size())
    {
        throw InvalidArgumentError(fmt::format("describeForTransfer: the shard has {} layers and the cache {}",
            shard.layers.size(), layout.layers.size()));
    }
    for (size_t i = 0; i < shard.layers.size(); ++i)
    {
        int32_t const heads = pageLayerGeometry(layout.layers[i]).numKVHeads;
        TensorParallelLayerShard const& layer = shard.layers[i];
        if (layer.numHeads != heads || layer.replicas < 1 || layer.firstHead < 0)
        {
            throw InvalidArgumentError(fmt::format("describeForTransfer: shard layer {} holds {} heads from head {} "
                                                   "with {} replicas; the cache's layer {} has {} heads",
                i, layer.numHeads, layer.firstHead, layer.replicas, i, heads));
        }
    }
    // A rank's state tensors are its share of the model's (split by their rules), so a cache built from another
    // config than the shard's would describe slots that the same rank of the other side does not hold.
    std::vector<StateLayerConfig> const& stateLayers = shard.config.stateLayerConfigs;
    if (stateLayers.size() != layout.stateLayers.size())
    {
        throw InvalidArgumentError(fmt::format("describeForTransfer: the shard's config has {} state layers and the "
                                               "cache {}",
            stateLayers.size(), layout.stateLayers.size()));
    }
    for (size_t i = 0; i < stateLayers.size(); ++i)
    {
        std::vector<StateTensorConfig> const& tensors = stateLayers[i].tensors;
        std::vector<StateTensorLayout> const& cached = layout.stateLayers[i].tensors;
        for (size_t t = 0; t < tensors.size() || t < cached.size(); ++t)
        {
            if (t >= tensors.size() || t >= cached.size() || tensors[t].shape != cached[t].shape)
            {
                throw InvalidArgumentError(fmt::format("describeForTransfer: state layer {} tensor {} is [{}] in the "
                                                       "shard's config and [{}] in the cache; build the cache from the "
                                                       "shard's config",
                    i, t, t < tensors.size() ? fmt::format("{}", fmt::join(tensors[t].shape, ", ")) : "none",
                    t < cached.size() ? fmt::format("{}", fmt::join(cached[t].shape, ", ")) : "none"));
            }
        }
    }
    if (shard.tp < 1 || shard.rank < 0 || shard.rank >= shard.tp)
    {
        throw InvalidArgumentError(fmt::format(
            "describeForTransfer: the shard's rank is {} of tp = {}; it must be in [0, tp)", shard.rank, shard.tp));
    }
}

// Little-endian writer and bounds-checked reader of the encoding.
class Writer
{
public:
    template <typename T>
    void put(T value)
    {
        uint8_t raw[sizeof(T)];
        std::memcpy(raw, &value, sizeof(T));
        bytes.insert(bytes.end(), raw, raw + sizeof(T));
    }
    std::vector<uint8_t> bytes;
};

class Reader
{
public:
    Reader(uint8_t const* data, size_t size)
        : mData(data)
        , mSize(size)
    {
    }
    template <typename T>
    T get(char const* field)
    {
        if (mSize - mOffset < sizeof(T))
        {
            throw InvalidArgumentError(fmt::format("decodeTransferDescription: the bytes end at offset {} of {}, "
                                                   "inside {}",
                mOffset, mSize, field));
        }
        T value;
        std::memcpy(&value, mData + mOffset, sizeof(T));
        mOffset += sizeof(T);
        return value;
    }
    //! Reads a count and checks it is in [0, limit].
    int32_t count(char const* field, int64_t limit)
    {
        auto const value = get<int32_t>(field);
        if (value < 0 || value > limit)
        {
            throw InvalidArgumentError(
                fmt::format("decodeTransferDescription: {} is {}; it must be in [0, {}]", field, value, limit));
        }
        return value;
    }
    size_t left() const noexcept
    {
        return mSize - mOffset;
    }

private:
    uint8_t const* mData;
    size_t mSize;
    size_t mOffset = 0;
};

//! Reads the state layers that end a version 2 description.
void readStateLayers(Reader& in, TransferDescription& description)
{
    constexpr int64_t kMAX_COUNT = std::numeric_limits<int32_t>::max();
    description.numStateSlots = in.count("numStateSlots", kMAX_COUNT);
    int32_t const numLayers = in.count("the number of state layers", static_cast<int64_t>(in.left()));
    for (int32_t l = 0; l < numLayers; ++l)
    {
        TransferStateLayer layer;
        int32_t const numTensors = in.count("the number of a state layer's tensors", static_cast<int64_t>(in.left()));
        for (int32_t t = 0; t < numTensors; ++t)
        {
            TransferStateTensor tensor;
            tensor.base = in.get<uint64_t>("a state tensor's base");
            tensor.dataType = static_cast<DataType>(in.get<int32_t>("a state tensor's dataType"));
            if (dataTypeSize(tensor.dataType) == 0)
            {
                throw InvalidArgumentError(fmt::format("decodeTransferDescription: state layer {} tensor {}'s "
                                                       "dataType is {}, not a data type",
                    l, t, static_cast<int32_t>(tensor.dataType)));
            }
            tensor.slotBytes = in.get<int64_t>("a state tensor's slotBytes");
            int32_t const dims = in.count("a state tensor's number of dimensions", kMAX_STATE_DIMS);
            int64_t elements = 1;
            for (int32_t d = 0; d < dims; ++d)
            {
                auto const extent = in.get<int64_t>("a state tensor's extent");
                // Bounded so that the product below cannot overflow.
                if (extent < 1 || extent > kMAX_COUNT)
                {
                    throw InvalidArgumentError(fmt::format("decodeTransferDescription: state layer {} tensor {}'s "
                                                           "extent {} is {}; it must be in [1, {}]",
                        l, t, d, extent, kMAX_COUNT));
                }
                tensor.shape.push_back(extent);
                // Both factors are at most 2^31 here, so the product fits; past the limit it stays there.
                elements = std::min(elements * extent, kMAX_COUNT + 1);
            }
            if (dims == 0 || elements > kMAX_COUNT || tensor.slotBytes != elements * dataTypeSize(tensor.dataType))
            {
                throw InvalidArgumentError(fmt::format("decodeTransferDescription: state layer {} tensor {}'s "
                                                       "slotBytes is {}; its {} extents of {} give {}",
                    l, t, tensor.slotBytes, dims, dataTypeName(tensor.dataType),
                    elements * dataTypeSize(tensor.dataType)));
            }
            layer.tensors.push_back(std::move(tensor));
        }
        description.stateLayers.push_back(std::move(layer));
    }
}

} // namespace

TransferDescription describeForTransfer(KVCacheLayout const& layout, std::vector<uint64_t> const& poolBases,
    int32_t device, std::vector<LayerScales> const& hostScales, TensorParallelShard const* shard)
{
    if (!hostScales.empty() && hostScales.size() != layout.layers.size())
    {
        throw InvalidArgumentError(fmt::format("describeForTransfer: hostScales holds {} entries; the layout has {} "
                                               "layers (or give none)",
            hostScales.size(), layout.layers.size()));
    }
    if (shard != nullptr)
    {
        checkShard(layout, *shard);
    }
    TransferDescription description;
    description.device = device;
    description.tp = shard != nullptr ? shard->tp : 1;
    description.rank = shard != nullptr ? shard->rank : 0;
    size_t base = 0;
    for (int32_t g = 0; g < static_cast<int32_t>(layout.groups.size()); ++g)
    {
        TransferGroup group;
        group.geometry = pageGeometry(layout, g);
        group.numPages = layout.groups[static_cast<size_t>(g)].numPages;
        for (int32_t const layer : layout.groups[static_cast<size_t>(g)].layers)
        {
            TransferLayer share;
            if (shard != nullptr)
            {
                share.firstHead = shard->layers[static_cast<size_t>(layer)].firstHead;
                share.replicas = shard->layers[static_cast<size_t>(layer)].replicas;
            }
            share.hostScales = hostScales.empty() ? LayerScales{} : hostScales[static_cast<size_t>(layer)];
            group.layers.push_back(share);
        }
        size_t const parts = detail::pageAnatomy(group.geometry).entries.size();
        if (poolBases.size() < base + parts)
        {
            throw InvalidArgumentError(fmt::format("describeForTransfer: poolBases holds {} addresses; the layout's "
                                                   "pages have more parts (group {} alone has {})",
                poolBases.size(), g, parts));
        }
        group.poolBases.assign(poolBases.begin() + static_cast<std::ptrdiff_t>(base),
            poolBases.begin() + static_cast<std::ptrdiff_t>(base + parts));
        base += parts;
        description.groups.push_back(std::move(group));
    }
    size_t const expected = base + layout.stateLayers.size();
    if (poolBases.size() != expected)
    {
        throw InvalidArgumentError(fmt::format("describeForTransfer: poolBases holds {} addresses; the layout's pages "
                                               "have {} parts and it has {} state layers (one address each)",
            poolBases.size(), base, layout.stateLayers.size()));
    }
    description.numStateSlots = layout.numStateSlots;
    for (StateLayerLayout const& stateLayer : layout.stateLayers)
    {
        TransferStateLayer described;
        for (StateTensorLayout const& tensor : stateLayer.tensors)
        {
            described.tensors.push_back({poolBases[base] + static_cast<uint64_t>(tensor.offsetBytes), tensor.dataType,
                tensor.shape, tensor.slotBytes});
        }
        description.stateLayers.push_back(std::move(described));
        ++base;
    }
    return description;
}

TransferDescription describeForTransfer(KVCacheManager const& cache, TensorParallelShard const* shard)
{
    KVCacheLayout const& layout = cache.layout();
    std::vector<uint64_t> bases;
    for (int32_t g = 0; g < cache.numGroups(); ++g)
    {
        for (detail::LayerTableEntry const& entry : detail::KVCacheManagerInternal::hostLayerTable(cache, g))
        {
            bases.push_back(reinterpret_cast<uint64_t>(entry.kBase));
        }
    }
    for (int32_t l = 0; l < cache.numStateLayers(); ++l)
    {
        // Tensor 0 starts the layer's allocation (offsetBytes 0).
        bases.push_back(reinterpret_cast<uint64_t>(cache.stateView(l, 0).rawPointer()));
    }
    std::vector<LayerScales> scales;
    if (detail::keepsHostScales(layout.quantization))
    {
        for (int32_t i = 0; i < cache.numLayers(); ++i)
        {
            scales.push_back(cache.layerScales(i));
        }
    }
    return describeForTransfer(layout, bases, cache.device(), scales, shard);
}

std::vector<uint8_t> encodeTransferDescription(TransferDescription const& description)
{
    Writer out;
    out.put(kMAGIC);
    out.put(kVERSION);
    out.put(description.device);
    out.put(description.tp);
    out.put(description.rank);
    out.put(static_cast<int32_t>(description.groups.size()));
    for (TransferGroup const& group : description.groups)
    {
        PageGeometry const& geometry = group.geometry;
        out.put(static_cast<int32_t>(geometry.dataType));
        out.put(static_cast<int32_t>(geometry.quantization));
        out.put(geometry.tokensPerPage);
        out.put(geometry.slidingWindow);
        out.put(geometry.bytesPerPage);
        out.put(group.numPages);
        out.put(static_cast<int32_t>(geometry.layers.size()));
        for (size_t i = 0; i < geometry.layers.size(); ++i)
        {
            out.put(static_cast<int32_t>(geometry.layers[i].kind));
            out.put(geometry.layers[i].numKVHeads);
            out.put(geometry.layers[i].headDim);
            TransferLayer const share = i < group.layers.size() ? group.layers[i] : TransferLayer{};
            out.put(share.firstHead);
            out.put(share.replicas);
            out.put(detail::bitsOf(share.hostScales.k));
            out.put(detail::bitsOf(share.hostScales.v));
        }
        out.put(static_cast<int32_t>(group.poolBases.size()));
        for (uint64_t const base : group.poolBases)
        {
            out.put(base);
        }
    }
    out.put(description.numStateSlots);
    out.put(static_cast<int32_t>(description.stateLayers.size()));
    for (TransferStateLayer const& layer : description.stateLayers)
    {
        out.put(static_cast<int32_t>(layer.tensors.size()));
        for (TransferStateTensor const& tensor : layer.tensors)
        {
            out.put(tensor.base);
            out.put(static_cast<int32_t>(tensor.dataType));
            out.put(tensor.slotBytes);
            out.put(static_cast<int32_t>(tensor.shape.size()));
            for (int64_t const extent : tensor.shape)
            {
                out.put(extent);
            }
        }
    }
    return out.bytes;
}

TransferDescription decodeTransferDescription(uint8_t const* bytes, size_t size)
{
    if (bytes == nullptr && size > 0)
    {
        throw InvalidArgumentError(fmt::format("decodeTransferDescription: bytes is null and size {}", size));
    }
    constexpr int64_t kMAX_COUNT = std::numeric_limits<int32_t>::max();
    Reader in(bytes, size);
    auto const magic = in.get<uint32_t>("the magic");
    if (magic != kMAGIC)
    {
        throw InvalidArgumentError(fmt::format(
            "decodeTransferDescription: the magic is {:#010x}; a transfer description starts with {:#010x} (\"KVTD\")",
            magic, kMAGIC));
    }
    auto const version = in.get<uint32_t>("the version");
    if (version != kVERSION && version != kVERSION_WITHOUT_STATES)
    {
        throw InvalidArgumentError(
            fmt::format("decodeTransferDescription: the version is {}; this library reads versions {} and {}", version,
                kVERSION_WITHOUT_STATES, kVERSION));
    }
    TransferDescription description;
    description.device = in.get<int32_t>("device");
    description.tp = in.get<int32_t>("tp");
    description.rank = in.get<int32_t>("rank");
    if (description.tp < 1 || description.rank < 0 || description.rank >= description.tp)
    {
        throw InvalidArgumentError(
            fmt::format("decodeTransferDescription: rank is {} of tp = {}; it must be in [0, tp)", description.rank,
                description.tp));
    }
    // Each count is bounded by the bytes left, so a corrupt count cannot ask for a huge allocation.
    int32_t const numGroups = in.count("the number of groups", static_cast<int64_t>(in.left()));
    for (int32_t g = 0; g < numGroups; ++g)
    {
        TransferGroup group;
        PageGeometry& geometry = group.geometry;
        geometry.dataType = static_cast<DataType>(in.get<int32_t>("dataType"));
        if (!isKVCacheDataType(geometry.dataType))
        {
            throw InvalidArgumentError(fmt::format("decodeTransferDescription: group {}'s dataType is {}, not a cache "
                                                   "data type",
                g, static_cast<int32_t>(geometry.dataType)));
        }
        geometry.quantization = static_cast<KVQuantization>(in.count("quantization", 3));
        geometry.tokensPerPage = in.count("tokensPerPage", kMAX_COUNT);
        geometry.slidingWindow = in.count("slidingWindow", kMAX_COUNT);
        geometry.bytesPerPage = in.get<int64_t>("bytesPerPage");
        group.numPages = in.count("numPages", kMAX_COUNT);
        int32_t const numLayers = in.count("the number of layers", static_cast<int64_t>(in.left()));
        for (int32_t i = 0; i < numLayers; ++i)
        {
            PageLayerGeometry layer;
            layer.kind = static_cast<KVLayerKind>(in.count("a layer's kind", 1));
            layer.numKVHeads = in.count("a layer's numKVHeads", kMAX_COUNT);
            layer.headDim = in.count("a layer's headDim", kMAX_COUNT);
            TransferLayer share;
            share.firstHead = in.count("a layer's firstHead", kMAX_COUNT);
            share.replicas = in.count("a layer's replicas", kMAX_COUNT);
            auto const k = in.get<uint32_t>("a layer's k scale");
            auto const v = in.get<uint32_t>("a layer's v scale");
            std::memcpy(&share.hostScales.k, &k, sizeof(k));
            std::memcpy(&share.hostScales.v, &v, sizeof(v));
            geometry.layers.push_back(layer);
            group.layers.push_back(share);
        }
        int32_t const numBases = in.count("the number of pool bases", static_cast<int64_t>(in.left()));
        for (int32_t i = 0; i < numBases; ++i)
        {
            group.poolBases.push_back(in.get<uint64_t>("a pool base"));
        }
        description.groups.push_back(std::move(group));
    }
    if (version != kVERSION_WITHOUT_STATES)
    {
        readStateLayers(in, description);
    }
    if (in.left() != 0)
    {
        throw InvalidArgumentError(
            fmt::format("decodeTransferDescription: {} bytes follow the description's end", in.left()));
    }
    return description;
}

std::vector<MemoryRange> registrationRanges(TransferDescription const& description)
{
    std::vector<MemoryRange> ranges;
    for (TransferGroup const& group : description.groups)
    {
        detail::PageAnatomy const anatomy = detail::pageAnatomy(group.geometry);
        for (size_t e = 0; e < anatomy.entries.size() && e < group.poolBases.size(); ++e)
        {
            detail::PageEntry const& entry = anatomy.entries[e];
            auto const bytes = static_cast<uint64_t>(entry.halves * int64_t{group.numPages} * entry.halfBytes);
            ranges.push_back({group.poolBases[e], bytes, description.device});
        }
    }
    auto const slots = static_cast<uint64_t>(description.numStateSlots);
    for (TransferStateLayer const& layer : description.stateLayers)
    {
        if (layer.tensors.empty())
        {
            continue;
        }
        uint64_t first = layer.tensors.front().base;
        uint64_t end = first;
        for (TransferStateTensor const& tensor : layer.tensors)
        {
            first = std::min(first, tensor.base);
            end = std::max(end, tensor.base + slots * static_cast<uint64_t>(tensor.slotBytes));
        }
        ranges.push_back({first, end - first, description.device});
    }
    return ranges;
}

} // namespace kvcache::rt
