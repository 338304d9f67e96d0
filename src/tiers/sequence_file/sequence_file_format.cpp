// The sequence file's header encoding, its checks and the page checksums.

#include "tiers/sequence_file/sequence_file_format.h"

#include "core/layout/page_anatomy.h"
#include "core/layout/scale_support.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

// Header-only use, as in page_hash.cpp: nothing links libxxhash.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace kvcache::rt::detail
{
namespace
{

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the file format is little-endian and written as memory is");

constexpr std::array<char, 8> kMAGIC{'K', 'V', 'C', 'S', 'E', 'Q', 'F', '\0'};
// A layer record: kind, numKVHeads, headDim, reserved (0), then the layer's host-held K and V scales (float32; 0 where
// the quantization keeps none, and for a latent layer's V).
constexpr int64_t kLAYER_RECORD_BYTES = 24;
//! Where the fixed header keeps the quantization (version 1 kept a reserved 0 there).
constexpr int64_t kQUANTIZATION_AT = 28;
//! More layers than any model has; bounds what a corrupt count can make the reader allocate.
constexpr int32_t kMAX_FILE_LAYERS = 1 << 16;
//! Version 3: after the layer records, the state tensor count and a reserved int32.
constexpr int64_t kSTATE_COUNT_BYTES = 8;
//! Where a state tensor record keeps its extents.
constexpr int64_t kSTATE_SHAPE_AT = 24;
static_assert(kSTATE_SHAPE_AT + kMAX_STATE_DIMS * 8 == kSEQUENCE_STATE_RECORD_BYTES, "a record's extents end it");

template <typename T>
void put(std::vector<char>& out, int64_t offset, T value)
{
    std::memcpy(out.data() + offset, &value, sizeof(T));
}

template <typename T>
T get(std::vector<char> const& in, int64_t offset)
{
    T value;
    std::memcpy(&value, in.data() + offset, sizeof(T));
    return value;
}

//! Returns "" when every field of `geometry` is within the rules computeLayout applies to the layers of a page
//! group, else the first broken rule naming the field, its value and the limit.
std::string geometryProblem(PageGeometry const& geometry)
{
    if (!isKVCacheDataType(geometry.dataType))
    {
        return fmt::format("dataType is {}; it must be a KV cache type", static_cast<int32_t>(geometry.dataType));
    }
    int32_t const tokensPerPage = geometry.tokensPerPage;
    if (tokensPerPage < 1 || tokensPerPage > kMAX_TOKENS_PER_PAGE || (tokensPerPage & (tokensPerPage - 1)) != 0)
    {
        return fmt::format(
            "tokensPerPage is {}; it must be a power of two in [1, {}]", tokensPerPage, kMAX_TOKENS_PER_PAGE);
    }
    if (geometry.slidingWindow < 0)
    {
        return fmt::format("slidingWindow is {}; it must be >= 0 (0 means full attention)", geometry.slidingWindow);
    }
    if (geometry.layers.empty() || geometry.layers.size() > static_cast<size_t>(kMAX_FILE_LAYERS))
    {
        return fmt::format("layers has {} entries; it must have [1, {}]", geometry.layers.size(), kMAX_FILE_LAYERS);
    }
    for (size_t i = 0; i < geometry.layers.size(); ++i)
    {
        PageLayerGeometry const& layer = geometry.layers[i];
        if (layer.kind != KVLayerKind::kKV && layer.kind != KVLayerKind::kLATENT)
        {
            return fmt::format(
                "layers[{}].kind is {}; it must be kKV (0) or kLATENT (1)", i, static_cast<int32_t>(layer.kind));
        }
        if (layer.numKVHeads <= 0)
        {
            return fmt::format("layers[{}].numKVHeads is {}; it must be > 0", i, layer.numKVHeads);
        }
        if (layer.kind == KVLayerKind::kLATENT && layer.numKVHeads != 1)
        {
            return fmt::format("layers[{}].numKVHeads is {}; a latent layer's must be 1", i, layer.numKVHeads);
        }
        if (layer.headDim <= 0)
        {
            return fmt::format("layers[{}].headDim is {}; it must be > 0", i, layer.headDim);
        }
    }
    return quantizationProblem(geometry);
}

//! Reads the state tensor records of a version 3 header into `info` (stateTensors, stateBytes), checked as a writer
//! checks them; unused extents must be 0.
void decodeStateTensors(
    std::string const& prefix, std::vector<char> const& header, int32_t numLayers, SequenceFileInfo& info)
{
    int64_t const statesAt = sequenceHeaderBytesBeforeStates(info.version, numLayers);
    auto const count = get<int32_t>(header, statesAt - kSTATE_COUNT_BYTES);
    for (int32_t i = 0; i < count; ++i)
    {
        int64_t const at = statesAt + int64_t{i} * kSEQUENCE_STATE_RECORD_BYTES;
        SequenceStateTensor tensor;
        tensor.stateLayer = get<int32_t>(header, at);
        tensor.tensor = get<int32_t>(header, at + 4);
        tensor.dataType = static_cast<DataType>(get<int32_t>(header, at + 8));
        auto const dims = get<int32_t>(header, at + 12);
        tensor.slotBytes = get<int64_t>(header, at + 16);
        if (dims < 1 || dims > kMAX_STATE_DIMS)
        {
            throw InvalidArgumentError(fmt::format(
                "{}stateTensors[{}] has {} dimensions; it must have 1 to {}", prefix, i, dims, kMAX_STATE_DIMS));
        }
        for (int32_t d = 0; d < kMAX_STATE_DIMS; ++d)
        {
            auto const extent = get<int64_t>(header, at + kSTATE_SHAPE_AT + int64_t{d} * 8);
            if (d < dims)
            {
                tensor.shape.push_back(extent);
            }
            else if (extent != 0)
            {
                throw InvalidArgumentError(fmt::format("{}stateTensors[{}] extent {} (past its {} dimensions) is {}; "
                                                       "it must be 0 (corrupt header)",
                    prefix, i, d, dims, extent));
            }
        }
        info.stateTensors.push_back(std::move(tensor));
    }
    info.stateBytes = checkStateTensors(prefix, "stateTensors", info.stateTensors);
}

} // namespace

int64_t sequenceHeaderBytesBeforeStates(uint32_t version, int64_t numLayers)
{
    return kSEQUENCE_FIXED_HEADER_BYTES + numLayers * kLAYER_RECORD_BYTES + (version >= 3 ? kSTATE_COUNT_BYTES : 0);
}

int64_t sequenceHeaderBytes(uint32_t version, int64_t numLayers, int64_t numStateTensors)
{
    return sequenceHeaderBytesBeforeStates(version, numLayers) + numStateTensors * kSEQUENCE_STATE_RECORD_BYTES
        + kSEQUENCE_CHECKSUM_BYTES;
}

uint32_t sequenceHeaderVersion(std::vector<char> const& header)
{
    return get<uint32_t>(header, 8);
}

int32_t decodeStateCount(char const* what, std::string const& path, std::vector<char> const& header, int32_t numLayers)
{
    int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + int64_t{numLayers} * kLAYER_RECORD_BYTES;
    auto const count = get<int32_t>(header, at);
    if (count < 0 || count > kMAX_FILE_STATE_TENSORS)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header numStateTensors is {}; it must be in [0, {}] (corrupt "
                                               "header)",
            what, path, count, kMAX_FILE_STATE_TENSORS));
    }
    auto const reserved = get<uint32_t>(header, at + 4);
    if (reserved != 0)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header reserved field at byte {} is {:#010x}; it must be 0 "
                                               "(corrupt header)",
            what, path, at + 4, reserved));
    }
    return count;
}

int64_t checkStateTensors(std::string const& prefix, char const* field, std::vector<SequenceStateTensor> const& tensors)
{
    if (tensors.size() > static_cast<size_t>(kMAX_FILE_STATE_TENSORS))
    {
        throw InvalidArgumentError(fmt::format(
            "{}{} has {} entries; the limit is {}", prefix, field, tensors.size(), kMAX_FILE_STATE_TENSORS));
    }
    int64_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i)
    {
        SequenceStateTensor const& tensor = tensors[i];
        // The packed order: each tensor the next of its layer, or the first of the next layer.
        bool inOrder = tensor.stateLayer == 0 && tensor.tensor == 0;
        if (i > 0)
        {
            SequenceStateTensor const& before = tensors[i - 1];
            inOrder = (tensor.stateLayer == before.stateLayer && tensor.tensor == before.tensor + 1)
                || (tensor.stateLayer == before.stateLayer + 1 && tensor.tensor == 0);
        }
        if (!inOrder)
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}] is state layer {} tensor {}; a state slot's tensors go "
                                                   "layer by layer from state layer 0 tensor 0, each layer's in order",
                prefix, field, i, tensor.stateLayer, tensor.tensor));
        }
        int64_t const elementBytes = dataTypeSize(tensor.dataType);
        if (elementBytes == 0)
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].dataType is {}, which is not a DataType value", prefix,
                field, i, static_cast<int32_t>(tensor.dataType)));
        }
        if (tensor.shape.empty() || tensor.shape.size() > static_cast<size_t>(kMAX_STATE_DIMS))
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].shape has {} dimensions; it must have 1 to {}", prefix,
                field, i, tensor.shape.size(), kMAX_STATE_DIMS));
        }
        int64_t bytes = elementBytes;
        bool overflow = false;
        for (size_t d = 0; d < tensor.shape.size(); ++d)
        {
            if (tensor.shape[d] <= 0)
            {
                throw InvalidArgumentError(
                    fmt::format("{}{}[{}].shape[{}] is {}; it must be > 0", prefix, field, i, d, tensor.shape[d]));
            }
            overflow = overflow || __builtin_mul_overflow(bytes, tensor.shape[d], &bytes);
        }
        if (overflow || bytes != tensor.slotBytes)
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].slotBytes is {}; its shape of {}-byte elements makes {}",
                prefix, field, i, tensor.slotBytes, elementBytes,
                overflow ? std::string("more than 64-bit sizes hold") : std::to_string(bytes)));
        }
        if (__builtin_add_overflow(total, tensor.slotBytes, &total))
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].slotBytes is {}; the state's bytes overflow 64 bits "
                                                   "(limit {})",
                prefix, field, i, tensor.slotBytes, std::numeric_limits<int64_t>::max()));
        }
    }
    return total;
}

void expectStateTensors(char const* what, std::string const& path, std::vector<SequenceStateTensor> const& file,
    std::vector<SequenceStateTensor> const& expected)
{
    if (file.empty())
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' holds no state (stateTensors is empty); the destination "
                                               "expects {} state tensors",
            what, path, expected.size()));
    }
    if (file.size() != expected.size())
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' has another state: stateTensors has {} entries in the file "
                                               "and {} in the destination",
            what, path, file.size(), expected.size()));
    }
    for (size_t i = 0; i < file.size(); ++i)
    {
        SequenceStateTensor const& mine = file[i];
        SequenceStateTensor const& theirs = expected[i];
        std::string difference;
        if (mine.stateLayer != theirs.stateLayer || mine.tensor != theirs.tensor)
        {
            difference = fmt::format("is state layer {} tensor {} in the file and state layer {} tensor {} in the "
                                     "destination",
                mine.stateLayer, mine.tensor, theirs.stateLayer, theirs.tensor);
        }
        else if (mine.dataType != theirs.dataType)
        {
            difference = fmt::format(".dataType is {} in the file and {} in the destination",
                dataTypeName(mine.dataType), dataTypeName(theirs.dataType));
        }
        else if (mine.shape != theirs.shape)
        {
            difference = fmt::format(".shape is [{}] in the file and [{}] in the destination",
                fmt::join(mine.shape, ", "), fmt::join(theirs.shape, ", "));
        }
        if (!difference.empty())
        {
            throw InvalidArgumentError(
                fmt::format("{}: '{}' has another state: stateTensors[{}]{}", what, path, i, difference));
        }
    }
}

uint64_t sequencePageChecksum(void const* page, int64_t bytes, int64_t index)
{
    return XXH3_64bits_withSeed(page, static_cast<size_t>(bytes), static_cast<XXH64_hash_t>(index));
}

uint64_t storedChecksum(std::vector<char> const& bytes, int64_t offset)
{
    return get<uint64_t>(bytes, offset);
}

void checkFileGeometry(std::string const& prefix, PageGeometry const& geometry)
{
    std::string const problem = geometryProblem(geometry);
    if (!problem.empty())
    {
        throw InvalidArgumentError(fmt::format("{}geometry.{}", prefix, problem));
    }
    int64_t implied = 0;
    try
    {
        implied = pageAnatomy(geometry).bytesPerPage;
    }
    catch (InvalidArgumentError const& error)
    {
        throw InvalidArgumentError(fmt::format("{}geometry.{}", prefix, error.what()));
    }
    if (implied != geometry.bytesPerPage)
    {
        throw InvalidArgumentError(fmt::format("{}geometry.bytesPerPage is {}; the layers make pages of {} bytes",
            prefix, geometry.bytesPerPage, implied));
    }
}

int64_t sequenceFileBytes(int64_t headerBytes, int64_t bytesPerPage, int64_t pageCount, int64_t stateBytes)
{
    int64_t perPage = 0;
    int64_t body = 0;
    int64_t total = 0;
    int64_t const state = stateBytes > 0 ? kSEQUENCE_CHECKSUM_BYTES : 0;
    if (__builtin_add_overflow(bytesPerPage, kSEQUENCE_CHECKSUM_BYTES, &perPage)
        || __builtin_mul_overflow(pageCount, perPage, &body) || __builtin_add_overflow(headerBytes, body, &total)
        || __builtin_add_overflow(total, state, &total) || __builtin_add_overflow(total, stateBytes, &total))
    {
        return -1;
    }
    return total;
}

int64_t sequenceTokenLimit(PageGeometry const& geometry, int64_t pageCount)
{
    int64_t tokens = 0;
    if (geometry.slidingWindow != 0 || __builtin_mul_overflow(pageCount, int64_t{geometry.tokensPerPage}, &tokens))
    {
        return std::numeric_limits<int64_t>::max();
    }
    return tokens;
}

std::vector<char> encodeSequenceHeader(PageGeometry const& geometry, std::vector<LayerScales> const& layerScales,
    int64_t pageCount, int64_t tokenCount, std::vector<SequenceStateTensor> const& stateTensors)
{
    auto const numLayers = static_cast<int64_t>(geometry.layers.size());
    auto const numStates = static_cast<int64_t>(stateTensors.size());
    std::vector<char> header(static_cast<size_t>(sequenceHeaderBytes(kSEQUENCE_FILE_VERSION, numLayers, numStates)), 0);
    std::memcpy(header.data(), kMAGIC.data(), kMAGIC.size());
    put<uint32_t>(header, 8, kSEQUENCE_FILE_VERSION);
    put<int32_t>(header, 12, static_cast<int32_t>(geometry.dataType));
    put<int32_t>(header, 16, geometry.tokensPerPage);
    put<int32_t>(header, 20, geometry.slidingWindow);
    put<int32_t>(header, 24, static_cast<int32_t>(numLayers));
    put<int32_t>(header, kQUANTIZATION_AT, static_cast<int32_t>(geometry.quantization));
    put<int64_t>(header, 32, geometry.bytesPerPage);
    put<int64_t>(header, 40, pageCount);
    put<int64_t>(header, 48, tokenCount);
    for (int64_t i = 0; i < numLayers; ++i)
    {
        PageLayerGeometry const& layer = geometry.layers[static_cast<size_t>(i)];
        int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + i * kLAYER_RECORD_BYTES;
        put<int32_t>(header, at, static_cast<int32_t>(layer.kind));
        put<int32_t>(header, at + 4, layer.numKVHeads);
        put<int32_t>(header, at + 8, layer.headDim);
        put<int32_t>(header, at + 12, 0);
        // Scales the quantization does not keep, and a latent layer's V, stay 0.
        LayerScales const scales = layerScales.empty() ? LayerScales{0.0F, 0.0F} : layerScales[static_cast<size_t>(i)];
        put<float>(header, at + 16, scales.k);
        put<float>(header, at + 20, layer.kind == KVLayerKind::kLATENT ? 0.0F : scales.v);
    }
    int64_t const statesAt = sequenceHeaderBytesBeforeStates(kSEQUENCE_FILE_VERSION, numLayers);
    put<int32_t>(header, statesAt - kSTATE_COUNT_BYTES, static_cast<int32_t>(numStates));
    for (int64_t i = 0; i < numStates; ++i)
    {
        SequenceStateTensor const& tensor = stateTensors[static_cast<size_t>(i)];
        int64_t const at = statesAt + i * kSEQUENCE_STATE_RECORD_BYTES;
        put<int32_t>(header, at, tensor.stateLayer);
        put<int32_t>(header, at + 4, tensor.tensor);
        put<int32_t>(header, at + 8, static_cast<int32_t>(tensor.dataType));
        put<int32_t>(header, at + 12, static_cast<int32_t>(tensor.shape.size()));
        put<int64_t>(header, at + 16, tensor.slotBytes);
        for (size_t d = 0; d < tensor.shape.size(); ++d)
        {
            put<int64_t>(header, at + kSTATE_SHAPE_AT + static_cast<int64_t>(d) * 8, tensor.shape[d]);
        }
    }
    int64_t const checksumAt = static_cast<int64_t>(header.size()) - kSEQUENCE_CHECKSUM_BYTES;
    put<uint64_t>(header, checksumAt, XXH3_64bits(header.data(), static_cast<size_t>(checksumAt)));
    return header;
}

int32_t decodeFixedHeader(char const* what, std::string const& path, std::vector<char> const& fixed)
{
    if (std::memcmp(fixed.data(), kMAGIC.data(), kMAGIC.size()) != 0)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' is not a sequence file: its magic bytes differ", what, path));
    }
    auto const version = get<uint32_t>(fixed, 8);
    if (version < kSEQUENCE_FILE_OLDEST_VERSION || version > kSEQUENCE_FILE_VERSION)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' has version {}; this build reads versions {} to {}", what,
            path, version, kSEQUENCE_FILE_OLDEST_VERSION, kSEQUENCE_FILE_VERSION));
    }
    auto const numLayers = get<int32_t>(fixed, 24);
    if (numLayers <= 0 || numLayers > kMAX_FILE_LAYERS)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' header numLayers is {}; it must be in [1, {}] (corrupt header)", what, path,
                numLayers, kMAX_FILE_LAYERS));
    }
    return numLayers;
}

SequenceFileInfo decodeSequenceHeader(
    char const* what, std::string const& path, std::vector<char> const& header, int64_t fileBytes)
{
    auto const allHeaderBytes = static_cast<int64_t>(header.size());
    int64_t const checksumAt = allHeaderBytes - kSEQUENCE_CHECKSUM_BYTES;
    auto const stored = get<uint64_t>(header, checksumAt);
    uint64_t const computed = XXH3_64bits(header.data(), static_cast<size_t>(checksumAt));
    if (stored != computed)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' header checksum is {:#018x}; its bytes hash to {:#018x} (corrupt header)", what, path,
                stored, computed));
    }

    SequenceFileInfo info{};
    info.version = get<uint32_t>(header, 8);
    info.geometry.dataType = static_cast<DataType>(get<int32_t>(header, 12));
    info.geometry.quantization = static_cast<KVQuantization>(get<int32_t>(header, kQUANTIZATION_AT));
    info.geometry.tokensPerPage = get<int32_t>(header, 16);
    info.geometry.slidingWindow = get<int32_t>(header, 20);
    info.geometry.bytesPerPage = get<int64_t>(header, 32);
    info.pageCount = get<int64_t>(header, 40);
    info.tokenCount = get<int64_t>(header, 48);
    std::string const prefix = fmt::format("{}: '{}' header ", what, path);
    // The padding in each layer record, and scales nobody uses: a writer leaves them 0.
    auto const checkReserved = [&](int64_t at, char const* field)
    {
        auto const reserved = get<uint32_t>(header, at);
        if (reserved != 0)
        {
            throw InvalidArgumentError(
                fmt::format("{}{} at byte {} is {:#010x}; it must be 0 (corrupt header)", prefix, field, at, reserved));
        }
    };
    auto const numLayers = get<int32_t>(header, 24);
    info.geometry.layers.resize(static_cast<size_t>(numLayers));
    for (int32_t i = 0; i < numLayers; ++i)
    {
        int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + int64_t{i} * kLAYER_RECORD_BYTES;
        PageLayerGeometry& layer = info.geometry.layers[static_cast<size_t>(i)];
        layer.kind = static_cast<KVLayerKind>(get<int32_t>(header, at));
        layer.numKVHeads = get<int32_t>(header, at + 4);
        layer.headDim = get<int32_t>(header, at + 8);
        checkReserved(at + 12, "reserved field");
    }
    checkFileGeometry(prefix, info.geometry);
    // The host-held scales: those the quantization keeps are checked as a writer checks them; the rest must be 0.
    bool const hostScales = keepsHostScales(info.geometry.quantization);
    for (int32_t i = 0; i < numLayers; ++i)
    {
        int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + int64_t{i} * kLAYER_RECORD_BYTES;
        bool const latent = info.geometry.layers[static_cast<size_t>(i)].kind == KVLayerKind::kLATENT;
        if (!hostScales)
        {
            checkReserved(at + 16, "a K scale the quantization does not keep");
        }
        if (!hostScales || latent)
        {
            checkReserved(at + 20, latent ? "a latent layer's V scale" : "a V scale the quantization does not keep");
        }
        if (hostScales)
        {
            info.layerScales.push_back(LayerScales{get<float>(header, at + 16), get<float>(header, at + 20)});
        }
    }
    checkLayerScales(prefix, "layerScales", info.geometry, info.layerScales);
    if (info.version >= 3)
    {
        decodeStateTensors(prefix, header, numLayers, info);
    }
    if (info.pageCount < 0 || info.tokenCount < 0)
    {
        throw InvalidArgumentError(fmt::format(
            "{}pageCount is {} and tokenCount {}; both must be >= 0", prefix, info.pageCount, info.tokenCount));
    }
    // Checksums and pages after the header: the file's size must be exactly that, computed without overflow.
    int64_t const expectedBytes =
        sequenceFileBytes(allHeaderBytes, info.geometry.bytesPerPage, info.pageCount, info.stateBytes);
    if (expectedBytes < 0)
    {
        throw InvalidArgumentError(fmt::format("{}pageCount is {}; with pages of {} bytes (and {} bytes of state) the "
                                               "file size overflows 64 bits (limit {})",
            prefix, info.pageCount, info.geometry.bytesPerPage, info.stateBytes, std::numeric_limits<int64_t>::max()));
    }
    int64_t const maxTokens = sequenceTokenLimit(info.geometry, info.pageCount);
    if (info.tokenCount > maxTokens)
    {
        throw InvalidArgumentError(fmt::format("{}tokenCount is {}; {} pages of full attention hold at most {}", prefix,
            info.tokenCount, info.pageCount, maxTokens));
    }
    if (fileBytes < expectedBytes)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' is truncated: file size is {} bytes; its header promises {}",
            what, path, fileBytes, expectedBytes));
    }
    if (fileBytes > expectedBytes)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' has trailing bytes: file size is {} bytes; its header promises {}", what, path,
                fileBytes, expectedBytes));
    }
    return info;
}

void expectGeometry(char const* what, std::string const& path, PageGeometry const& file, PageGeometry const& expected)
{
    std::string const difference = pageGeometryDifference(file, expected, "the file", "the destination");
    if (!difference.empty())
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' has another geometry: {}", what, path, difference));
    }
}

} // namespace kvcache::rt::detail

namespace kvcache::rt
{

std::vector<SequenceStateTensor> sequenceStateTensors(KVCacheLayout const& layout)
{
    // The packed order is the state slot anatomy's.
    std::vector<SequenceStateTensor> tensors;
    for (detail::StateSlotEntry const& entry : detail::stateSlotAnatomy(layout).entries)
    {
        StateTensorLayout const& tensor =
            layout.stateLayers[static_cast<size_t>(entry.stateLayer)].tensors[static_cast<size_t>(entry.tensor)];
        tensors.push_back(
            SequenceStateTensor{entry.stateLayer, entry.tensor, tensor.dataType, tensor.shape, entry.bytes});
    }
    return tensors;
}

} // namespace kvcache::rt
