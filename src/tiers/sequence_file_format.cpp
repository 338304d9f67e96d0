// The sequence file's header encoding, its checks and the page checksums.

#include "tiers/sequence_file_format.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

// Header-only use, as in page_hash.cpp: nothing links libxxhash.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <array>
#include <cstring>
#include <limits>

namespace kvcache::rt::detail
{
namespace
{

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the file format is little-endian and written as memory is");

constexpr std::array<char, 8> kMAGIC{'K', 'V', 'C', 'S', 'E', 'Q', 'F', '\0'};
constexpr int64_t kLAYER_RECORD_BYTES = 16;
//! More layers than any model has; bounds what a corrupt count can make the reader allocate.
constexpr int32_t kMAX_FILE_LAYERS = 1 << 16;

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

//! Returns the page bytes `geometry`'s layers imply, or -1 when a field is out of range (named in `*problem`).
int64_t impliedPageBytes(PageGeometry const& geometry, std::string* problem)
{
    int64_t const elementBytes = dataTypeSize(geometry.dataType);
    if (elementBytes == 0 || !isKVCacheDataType(geometry.dataType))
    {
        *problem = fmt::format("dataType is {}; it must be a KV cache type", static_cast<int32_t>(geometry.dataType));
        return -1;
    }
    if (geometry.tokensPerPage <= 0)
    {
        *problem = fmt::format("tokensPerPage is {}; it must be > 0", geometry.tokensPerPage);
        return -1;
    }
    if (geometry.layers.empty() || geometry.layers.size() > static_cast<size_t>(kMAX_FILE_LAYERS))
    {
        *problem =
            fmt::format("the layer count is {}; it must be in [1, {}]", geometry.layers.size(), kMAX_FILE_LAYERS);
        return -1;
    }
    int64_t total = 0;
    for (size_t i = 0; i < geometry.layers.size(); ++i)
    {
        PageLayerGeometry const& layer = geometry.layers[i];
        bool const kindOk = layer.kind == KVLayerKind::kKV || layer.kind == KVLayerKind::kLATENT;
        if (!kindOk || layer.numKVHeads <= 0 || layer.headDim <= 0)
        {
            *problem = fmt::format("layers[{}] is kind {}, {} heads, headDim {}; kinds are 0 or 1, sizes > 0", i,
                static_cast<int32_t>(layer.kind), layer.numKVHeads, layer.headDim);
            return -1;
        }
        int64_t const halves = layer.kind == KVLayerKind::kLATENT ? 1 : 2;
        // Each factor is below 2^31 and there are at most 2^16 layers, so nothing here overflows 64 bits.
        total += halves * geometry.tokensPerPage * int64_t{layer.numKVHeads} * layer.headDim * elementBytes;
    }
    return total;
}

template <typename T>
void expectField(char const* what, std::string const& path, std::string const& field, T file, T expected)
{
    if (file != expected)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: '{}' has another geometry: its {} is {}; the destination's is {}", what, path, field, file, expected));
    }
}

} // namespace

int64_t sequenceHeaderBytes(int64_t numLayers)
{
    return kSEQUENCE_FIXED_HEADER_BYTES + numLayers * kLAYER_RECORD_BYTES + kSEQUENCE_CHECKSUM_BYTES;
}

uint64_t sequencePageChecksum(void const* page, int64_t bytes, int64_t index)
{
    return XXH3_64bits_withSeed(page, static_cast<size_t>(bytes), static_cast<XXH64_hash_t>(index));
}

uint64_t storedChecksum(std::vector<char> const& bytes, int64_t offset)
{
    return get<uint64_t>(bytes, offset);
}

void checkFileGeometry(char const* what, PageGeometry const& geometry)
{
    std::string problem;
    int64_t const implied = impliedPageBytes(geometry, &problem);
    if (implied < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: geometry {}", what, problem));
    }
    if (implied != geometry.bytesPerPage)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: bytesPerPage is {}; the layers make pages of {} bytes", what, geometry.bytesPerPage, implied));
    }
}

std::vector<char> encodeSequenceHeader(PageGeometry const& geometry, int64_t pageCount, int64_t tokenCount)
{
    auto const numLayers = static_cast<int64_t>(geometry.layers.size());
    std::vector<char> header(static_cast<size_t>(sequenceHeaderBytes(numLayers)), 0);
    std::memcpy(header.data(), kMAGIC.data(), kMAGIC.size());
    put<uint32_t>(header, 8, kSEQUENCE_FILE_VERSION);
    put<int32_t>(header, 12, static_cast<int32_t>(geometry.dataType));
    put<int32_t>(header, 16, geometry.tokensPerPage);
    put<int32_t>(header, 20, geometry.slidingWindow);
    put<int32_t>(header, 24, static_cast<int32_t>(numLayers));
    put<int32_t>(header, 28, 0);
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
    if (version != kSEQUENCE_FILE_VERSION)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: '{}' has version {}; this build reads version {}", what, path, version, kSEQUENCE_FILE_VERSION));
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
    info.geometry.tokensPerPage = get<int32_t>(header, 16);
    info.geometry.slidingWindow = get<int32_t>(header, 20);
    info.geometry.bytesPerPage = get<int64_t>(header, 32);
    info.pageCount = get<int64_t>(header, 40);
    info.tokenCount = get<int64_t>(header, 48);
    auto const numLayers = get<int32_t>(header, 24);
    info.geometry.layers.resize(static_cast<size_t>(numLayers));
    for (int32_t i = 0; i < numLayers; ++i)
    {
        int64_t const at = kSEQUENCE_FIXED_HEADER_BYTES + int64_t{i} * kLAYER_RECORD_BYTES;
        PageLayerGeometry& layer = info.geometry.layers[static_cast<size_t>(i)];
        layer.kind = static_cast<KVLayerKind>(get<int32_t>(header, at));
        layer.numKVHeads = get<int32_t>(header, at + 4);
        layer.headDim = get<int32_t>(header, at + 8);
    }
    checkFileGeometry(what, info.geometry);
    if (info.pageCount < 0 || info.tokenCount < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header pageCount is {} and tokenCount {}; both must be >= 0",
            what, path, info.pageCount, info.tokenCount));
    }
    // Checksums and pages after the header: the file's size must be exactly that, computed without overflow.
    int64_t const maxPages = (std::numeric_limits<int64_t>::max() - allHeaderBytes)
        / (info.geometry.bytesPerPage + kSEQUENCE_CHECKSUM_BYTES);
    if (info.pageCount > maxPages)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header pageCount is {}; the limit for its page size is {}",
            what, path, info.pageCount, maxPages));
    }
    int64_t const expectedBytes =
        allHeaderBytes + info.pageCount * (kSEQUENCE_CHECKSUM_BYTES + info.geometry.bytesPerPage);
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
    expectField(what, path, "dataType", static_cast<int32_t>(file.dataType), static_cast<int32_t>(expected.dataType));
    expectField(what, path, "tokensPerPage", file.tokensPerPage, expected.tokensPerPage);
    expectField(what, path, "slidingWindow", file.slidingWindow, expected.slidingWindow);
    expectField(what, path, "layer count", file.layers.size(), expected.layers.size());
    for (size_t i = 0; i < file.layers.size(); ++i)
    {
        expectField(what, path, fmt::format("layers[{}].kind", i), static_cast<int32_t>(file.layers[i].kind),
            static_cast<int32_t>(expected.layers[i].kind));
        expectField(what, path, fmt::format("layers[{}].numKVHeads", i), file.layers[i].numKVHeads,
            expected.layers[i].numKVHeads);
        expectField(
            what, path, fmt::format("layers[{}].headDim", i), file.layers[i].headDim, expected.layers[i].headDim);
    }
    expectField(what, path, "bytesPerPage", file.bytesPerPage, expected.bytesPerPage);
}

} // namespace kvcache::rt::detail
