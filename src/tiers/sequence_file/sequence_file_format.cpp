// The sequence file's header encoding, its checks and the page checksums.

#include "tiers/sequence_file/sequence_file_format.h"

#include "core/layout/page_anatomy.h"
#include "core/layout/scale_support.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

// Header-only use, as in page_hash.cpp: nothing links libxxhash.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <array>
#include <cstring>
#include <limits>
#include <string>

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
    return readAt<uint32_t>(header, 8);
}

int32_t decodeStateCount(char const* what, std::string const& path, std::vector<char> const& header, int32_t numLayers)
{
    int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + int64_t{numLayers} * kLAYER_RECORD_BYTES;
    auto const count = readAt<int32_t>(header, at);
    if (count < 0 || count > kMAX_FILE_STATE_TENSORS)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header numStateTensors is {}; it must be in [0, {}] (corrupt "
                                               "header)",
            what, path, count, kMAX_FILE_STATE_TENSORS));
    }
    auto const reserved = readAt<uint32_t>(header, at + 4);
    if (reserved != 0)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header reserved field at byte {} is {:#010x}; it must be 0 "
                                               "(corrupt header)",
            what, path, at + 4, reserved));
    }
    return count;
}

uint64_t sequencePageChecksum(void const* page, int64_t bytes, int64_t index)
{
    return XXH3_64bits_withSeed(page, static_cast<size_t>(bytes), static_cast<XXH64_hash_t>(index));
}

uint64_t storedChecksum(std::vector<char> const& bytes, int64_t offset)
{
    return readAt<uint64_t>(bytes, offset);
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
    writeAt<uint32_t>(header, 8, kSEQUENCE_FILE_VERSION);
    writeAt<int32_t>(header, 12, static_cast<int32_t>(geometry.dataType));
    writeAt<int32_t>(header, 16, geometry.tokensPerPage);
    writeAt<int32_t>(header, 20, geometry.slidingWindow);
    writeAt<int32_t>(header, 24, static_cast<int32_t>(numLayers));
    writeAt<int32_t>(header, kQUANTIZATION_AT, static_cast<int32_t>(geometry.quantization));
    writeAt<int64_t>(header, 32, geometry.bytesPerPage);
    writeAt<int64_t>(header, 40, pageCount);
    writeAt<int64_t>(header, 48, tokenCount);
    for (int64_t i = 0; i < numLayers; ++i)
    {
        PageLayerGeometry const& layer = geometry.layers[static_cast<size_t>(i)];
        int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + i * kLAYER_RECORD_BYTES;
        writeAt<int32_t>(header, at, static_cast<int32_t>(layer.kind));
        writeAt<int32_t>(header, at + 4, layer.numKVHeads);
        writeAt<int32_t>(header, at + 8, layer.headDim);
        writeAt<int32_t>(header, at + 12, 0);
        // Scales the quantization does not keep, and a latent layer's V, stay 0.
        LayerScales const scales = layerScales.empty() ? LayerScales{0.0F, 0.0F} : layerScales[static_cast<size_t>(i)];
        writeAt<float>(header, at + 16, scales.k);
        writeAt<float>(header, at + 20, layer.kind == KVLayerKind::kLATENT ? 0.0F : scales.v);
    }
    int64_t const statesAt = sequenceHeaderBytesBeforeStates(kSEQUENCE_FILE_VERSION, numLayers);
    writeAt<int32_t>(header, statesAt - kSTATE_COUNT_BYTES, static_cast<int32_t>(numStates));
    encodeStateTensors(stateTensors, statesAt, header);
    int64_t const checksumAt = static_cast<int64_t>(header.size()) - kSEQUENCE_CHECKSUM_BYTES;
    writeAt<uint64_t>(header, checksumAt, XXH3_64bits(header.data(), static_cast<size_t>(checksumAt)));
    return header;
}

int32_t decodeFixedHeader(char const* what, std::string const& path, std::vector<char> const& fixed)
{
    if (std::memcmp(fixed.data(), kMAGIC.data(), kMAGIC.size()) != 0)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' is not a sequence file: its magic bytes differ", what, path));
    }
    auto const version = readAt<uint32_t>(fixed, 8);
    if (version < kSEQUENCE_FILE_OLDEST_VERSION || version > kSEQUENCE_FILE_VERSION)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' has version {}; this build reads versions {} to {}", what,
            path, version, kSEQUENCE_FILE_OLDEST_VERSION, kSEQUENCE_FILE_VERSION));
    }
    auto const numLayers = readAt<int32_t>(fixed, 24);
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
    auto const stored = readAt<uint64_t>(header, checksumAt);
    uint64_t const computed = XXH3_64bits(header.data(), static_cast<size_t>(checksumAt));
    if (stored != computed)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' header checksum is {:#018x}; its bytes hash to {:#018x} (corrupt header)", what, path,
                stored, computed));
    }

    SequenceFileInfo info{};
    info.version = readAt<uint32_t>(header, 8);
    info.geometry.dataType = static_cast<DataType>(readAt<int32_t>(header, 12));
    info.geometry.quantization = static_cast<KVQuantization>(readAt<int32_t>(header, kQUANTIZATION_AT));
    info.geometry.tokensPerPage = readAt<int32_t>(header, 16);
    info.geometry.slidingWindow = readAt<int32_t>(header, 20);
    info.geometry.bytesPerPage = readAt<int64_t>(header, 32);
    info.pageCount = readAt<int64_t>(header, 40);
    info.tokenCount = readAt<int64_t>(header, 48);
    std::string const prefix = fmt::format("{}: '{}' header ", what, path);
    // The padding in each layer record, and scales nobody uses: a writer leaves them 0.
    auto const checkReserved = [&](int64_t at, char const* field)
    {
        auto const reserved = readAt<uint32_t>(header, at);
        if (reserved != 0)
        {
            throw InvalidArgumentError(
                fmt::format("{}{} at byte {} is {:#010x}; it must be 0 (corrupt header)", prefix, field, at, reserved));
        }
    };
    auto const numLayers = readAt<int32_t>(header, 24);
    info.geometry.layers.resize(static_cast<size_t>(numLayers));
    for (int32_t i = 0; i < numLayers; ++i)
    {
        int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + int64_t{i} * kLAYER_RECORD_BYTES;
        PageLayerGeometry& layer = info.geometry.layers[static_cast<size_t>(i)];
        layer.kind = static_cast<KVLayerKind>(readAt<int32_t>(header, at));
        layer.numKVHeads = readAt<int32_t>(header, at + 4);
        layer.headDim = readAt<int32_t>(header, at + 8);
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
            info.layerScales.push_back(LayerScales{readAt<float>(header, at + 16), readAt<float>(header, at + 20)});
        }
    }
    checkLayerScales(prefix, "layerScales", info.geometry, info.layerScales);
    if (info.version >= 3)
    {
        int64_t const statesAt = sequenceHeaderBytesBeforeStates(info.version, numLayers);
        info.stateTensors =
            decodeStateTensors(prefix, header, statesAt, readAt<int32_t>(header, statesAt - kSTATE_COUNT_BYTES));
        info.stateBytes = checkStateTensors(prefix, "stateTensors", info.stateTensors);
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
