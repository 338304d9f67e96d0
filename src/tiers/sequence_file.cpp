// Sequence files: a checked header, a checksum a page, the pages; written atomically, verified whole before use.

#include "kvcache/tiers/sequence_file.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

// Header-only use, as in page_hash.cpp: nothing links libxxhash.
#define XXH_INLINE_ALL
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>

namespace kvcache::rt
{
namespace
{

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the file format is little-endian and written as memory is");

constexpr std::array<char, 8> kMAGIC{'K', 'V', 'C', 'S', 'E', 'Q', 'F', '\0'};
//! Bytes of the fixed part of the header, before the layers.
constexpr int64_t kFIXED_HEADER_BYTES = 56;
constexpr int64_t kLAYER_RECORD_BYTES = 16;
constexpr int64_t kCHECKSUM_BYTES = 8;
//! More layers than any model has; bounds what a corrupt count can make the reader allocate.
constexpr int32_t kMAX_FILE_LAYERS = 1 << 16;

int64_t headerBytes(int64_t numLayers)
{
    return kFIXED_HEADER_BYTES + numLayers * kLAYER_RECORD_BYTES + kCHECKSUM_BYTES;
}

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

uint64_t pageChecksum(void const* page, int64_t bytes, int64_t index)
{
    return XXH3_64bits_withSeed(page, static_cast<size_t>(bytes), static_cast<XXH64_hash_t>(index));
}

//! Returns the page bytes `geometry`'s layers imply, or -1 when a field is out of range (named in `*problem`).
int64_t impliedPageBytes(SequenceFileGeometry const& geometry, std::string* problem)
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
        SequenceFileLayer const& layer = geometry.layers[i];
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

void checkGeometry(char const* what, SequenceFileGeometry const& geometry)
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

std::string ioMessage(char const* what, char const* action, std::string const& path, int error)
{
    return fmt::format("{}: cannot {} '{}': {}", what, action, path, std::strerror(error));
}

//! Closes a file descriptor at scope exit.
class FileDescriptor
{
public:
    explicit FileDescriptor(int fd) noexcept
        : mFd(fd)
    {
    }
    ~FileDescriptor()
    {
        if (mFd >= 0)
        {
            ::close(mFd);
        }
    }
    FileDescriptor(FileDescriptor const&) = delete;
    FileDescriptor& operator=(FileDescriptor const&) = delete;
    int get() const noexcept
    {
        return mFd;
    }
    //! Closes now and returns 0 or errno.
    int close() noexcept
    {
        int const status = ::close(mFd);
        mFd = -1;
        return status == 0 ? 0 : errno;
    }

private:
    int mFd;
};

//! Writes all `bytes`; returns 0 or errno.
int writeAll(int fd, void const* data, int64_t bytes)
{
    auto const* at = static_cast<char const*>(data);
    while (bytes > 0)
    {
        // Linux moves at most about 2 GiB a call.
        size_t const part = static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30));
        ssize_t const written = ::write(fd, at, part);
        if (written < 0)
        {
            if (errno == EINTR)
            {
                continue;
            }
            return errno;
        }
        at += written;
        bytes -= written;
    }
    return 0;
}

//! Reads up to `bytes`; returns the bytes read (fewer at the end of the file) or -errno.
int64_t readAll(int fd, void* data, int64_t bytes)
{
    auto* at = static_cast<char*>(data);
    int64_t done = 0;
    while (done < bytes)
    {
        size_t const part = static_cast<size_t>(std::min<int64_t>(bytes - done, int64_t{1} << 30));
        ssize_t const got = ::read(fd, at + done, part);
        if (got < 0)
        {
            if (errno == EINTR)
            {
                continue;
            }
            return -errno;
        }
        if (got == 0)
        {
            break;
        }
        done += got;
    }
    return done;
}

std::vector<char> encodeHeader(SequenceFileGeometry const& geometry, int64_t pageCount, int64_t tokenCount)
{
    auto const numLayers = static_cast<int64_t>(geometry.layers.size());
    std::vector<char> header(static_cast<size_t>(headerBytes(numLayers)), 0);
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
        SequenceFileLayer const& layer = geometry.layers[static_cast<size_t>(i)];
        int64_t const at = kFIXED_HEADER_BYTES + i * kLAYER_RECORD_BYTES;
        put<int32_t>(header, at, static_cast<int32_t>(layer.kind));
        put<int32_t>(header, at + 4, layer.numKVHeads);
        put<int32_t>(header, at + 8, layer.headDim);
        put<int32_t>(header, at + 12, 0);
    }
    int64_t const checksumAt = static_cast<int64_t>(header.size()) - kCHECKSUM_BYTES;
    put<uint64_t>(header, checksumAt, XXH3_64bits(header.data(), static_cast<size_t>(checksumAt)));
    return header;
}

//! An open sequence file whose header has been read and checked, with the size it promises matching the file's.
struct OpenedFile
{
    SequenceFileInfo info;
    int64_t headerBytes;
};

OpenedFile readHeader(char const* what, std::string const& path, int fd)
{
    struct stat status
    {
    };
    if (::fstat(fd, &status) != 0)
    {
        throw Error(ioMessage(what, "stat", path, errno));
    }
    int64_t const fileBytes = status.st_size;
    std::vector<char> header(static_cast<size_t>(kFIXED_HEADER_BYTES));
    int64_t got = readAll(fd, header.data(), kFIXED_HEADER_BYTES);
    if (got < 0)
    {
        throw Error(ioMessage(what, "read", path, static_cast<int>(-got)));
    }
    if (got < kFIXED_HEADER_BYTES)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' is truncated: file size is {} bytes; a header needs at least {}", what, path,
                fileBytes, kFIXED_HEADER_BYTES));
    }
    if (std::memcmp(header.data(), kMAGIC.data(), kMAGIC.size()) != 0)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' is not a sequence file: its magic bytes differ", what, path));
    }
    auto const version = get<uint32_t>(header, 8);
    if (version != kSEQUENCE_FILE_VERSION)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: '{}' has version {}; this build reads version {}", what, path, version, kSEQUENCE_FILE_VERSION));
    }
    auto const numLayers = get<int32_t>(header, 24);
    if (numLayers <= 0 || numLayers > kMAX_FILE_LAYERS)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' header numLayers is {}; it must be in [1, {}] (corrupt header)", what, path,
                numLayers, kMAX_FILE_LAYERS));
    }
    int64_t const allHeaderBytes = headerBytes(numLayers);
    header.resize(static_cast<size_t>(allHeaderBytes));
    int64_t const rest = allHeaderBytes - kFIXED_HEADER_BYTES;
    got = readAll(fd, header.data() + kFIXED_HEADER_BYTES, rest);
    if (got < 0)
    {
        throw Error(ioMessage(what, "read", path, static_cast<int>(-got)));
    }
    if (got < rest)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' is truncated: file size is {} bytes; its header needs {}",
            what, path, fileBytes, allHeaderBytes));
    }
    int64_t const checksumAt = allHeaderBytes - kCHECKSUM_BYTES;
    auto const stored = get<uint64_t>(header, checksumAt);
    uint64_t const computed = XXH3_64bits(header.data(), static_cast<size_t>(checksumAt));
    if (stored != computed)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' header checksum is {:#018x}; its bytes hash to {:#018x} (corrupt header)", what, path,
                stored, computed));
    }

    OpenedFile opened{};
    SequenceFileInfo& info = opened.info;
    info.version = version;
    info.geometry.dataType = static_cast<DataType>(get<int32_t>(header, 12));
    info.geometry.tokensPerPage = get<int32_t>(header, 16);
    info.geometry.slidingWindow = get<int32_t>(header, 20);
    info.geometry.bytesPerPage = get<int64_t>(header, 32);
    info.pageCount = get<int64_t>(header, 40);
    info.tokenCount = get<int64_t>(header, 48);
    info.geometry.layers.resize(static_cast<size_t>(numLayers));
    for (int32_t i = 0; i < numLayers; ++i)
    {
        int64_t const at = kFIXED_HEADER_BYTES + int64_t{i} * kLAYER_RECORD_BYTES;
        SequenceFileLayer& layer = info.geometry.layers[static_cast<size_t>(i)];
        layer.kind = static_cast<KVLayerKind>(get<int32_t>(header, at));
        layer.numKVHeads = get<int32_t>(header, at + 4);
        layer.headDim = get<int32_t>(header, at + 8);
    }
    checkGeometry(what, info.geometry);
    if (info.pageCount < 0 || info.tokenCount < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header pageCount is {} and tokenCount {}; both must be >= 0",
            what, path, info.pageCount, info.tokenCount));
    }
    // Checksums and pages after the header: the file's size must be exactly that, computed without overflow.
    int64_t const maxPages =
        (std::numeric_limits<int64_t>::max() - allHeaderBytes) / (info.geometry.bytesPerPage + kCHECKSUM_BYTES);
    if (info.pageCount > maxPages)
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' header pageCount is {}; the limit for its page size is {}",
            what, path, info.pageCount, maxPages));
    }
    int64_t const expectedBytes = allHeaderBytes + info.pageCount * (kCHECKSUM_BYTES + info.geometry.bytesPerPage);
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
    opened.headerBytes = allHeaderBytes;
    return opened;
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

void expectGeometry(
    char const* what, std::string const& path, SequenceFileGeometry const& file, SequenceFileGeometry const& expected)
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

} // namespace

SequenceFileGeometry sequenceFileGeometry(KVCacheLayout const& layout, int32_t group)
{
    if (group < 0 || static_cast<size_t>(group) >= layout.groups.size())
    {
        throw OutOfRangeError(
            fmt::format("sequenceFileGeometry: group is {}; groups are [0, {})", group, layout.groups.size()));
    }
    KVPageGroupLayout const& groupLayout = layout.groups[static_cast<size_t>(group)];
    SequenceFileGeometry geometry;
    geometry.dataType = layout.dataType;
    geometry.tokensPerPage = layout.tokensPerPage;
    geometry.slidingWindow = groupLayout.slidingWindow;
    geometry.bytesPerPage = groupLayout.bytesPerPage;
    for (int32_t const layer : groupLayout.layers)
    {
        KVLayerLayout const& layerLayout = layout.layers[static_cast<size_t>(layer)];
        geometry.layers.push_back(SequenceFileLayer{layerLayout.kind, layerLayout.numKVHeads, layerLayout.headDim});
    }
    return geometry;
}

void writeSequenceFile(std::string const& path, SequenceFileGeometry const& geometry, int64_t tokenCount,
    void const* const* pages, int64_t pageCount)
{
    constexpr char const* kWHAT = "writeSequenceFile";
    checkGeometry(kWHAT, geometry);
    if (pageCount < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: pageCount is {}; it must be >= 0", kWHAT, pageCount));
    }
    if (pages == nullptr && pageCount > 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the page list is null but pageCount is {}", kWHAT, pageCount));
    }
    for (int64_t i = 0; i < pageCount; ++i)
    {
        if (pages[i] == nullptr)
        {
            throw InvalidArgumentError(fmt::format("{}: pages[{}] is null", kWHAT, i));
        }
    }
    int64_t const maxTokens =
        geometry.slidingWindow == 0 ? pageCount * geometry.tokensPerPage : std::numeric_limits<int64_t>::max();
    if (tokenCount < 0 || tokenCount > maxTokens)
    {
        throw InvalidArgumentError(
            fmt::format("{}: tokenCount is {}; it must be in [0, {}]", kWHAT, tokenCount, maxTokens));
    }

    std::vector<char> const header = encodeHeader(geometry, pageCount, tokenCount);
    std::vector<uint64_t> checksums(static_cast<size_t>(pageCount));
    for (int64_t i = 0; i < pageCount; ++i)
    {
        checksums[static_cast<size_t>(i)] = pageChecksum(pages[i], geometry.bytesPerPage, i);
    }

    // A name no other writer in this process or another uses, beside the target so that rename stays on one file
    // system.
    static std::atomic<uint64_t> serial{0};
    std::string const temporary = fmt::format("{}.tmp.{}.{}", path, ::getpid(), serial.fetch_add(1));
    FileDescriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0)
    {
        throw Error(ioMessage(kWHAT, "create", temporary, errno));
    }
    int error = writeAll(fd.get(), header.data(), static_cast<int64_t>(header.size()));
    if (error == 0)
    {
        error = writeAll(fd.get(), checksums.data(), pageCount * kCHECKSUM_BYTES);
    }
    for (int64_t i = 0; i < pageCount && error == 0; ++i)
    {
        error = writeAll(fd.get(), pages[i], geometry.bytesPerPage);
    }
    if (error == 0 && ::fsync(fd.get()) != 0)
    {
        error = errno;
    }
    int const closeError = fd.close();
    error = error != 0 ? error : closeError;
    if (error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0)
    {
        error = errno;
    }
    if (error != 0)
    {
        ::unlink(temporary.c_str());
        throw Error(ioMessage(kWHAT, "write", path, error));
    }
}

SequenceFileInfo readSequenceFileInfo(std::string const& path)
{
    constexpr char const* kWHAT = "readSequenceFileInfo";
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0)
    {
        throw Error(ioMessage(kWHAT, "open", path, errno));
    }
    return readHeader(kWHAT, path, fd.get()).info;
}

int64_t readSequenceFile(
    std::string const& path, SequenceFileGeometry const& expected, void* const* pages, int64_t pageCount)
{
    constexpr char const* kWHAT = "readSequenceFile";
    if (pageCount < 0 || (pages == nullptr && pageCount > 0))
    {
        throw InvalidArgumentError(fmt::format("{}: pageCount is {} with a {} page list; it must be >= 0 with a list",
            kWHAT, pageCount, pages == nullptr ? "null" : "non-null"));
    }
    for (int64_t i = 0; i < pageCount; ++i)
    {
        if (pages[i] == nullptr)
        {
            throw InvalidArgumentError(fmt::format("{}: pages[{}] is null", kWHAT, i));
        }
    }
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0)
    {
        throw Error(ioMessage(kWHAT, "open", path, errno));
    }
    OpenedFile const opened = readHeader(kWHAT, path, fd.get());
    SequenceFileInfo const& info = opened.info;
    expectGeometry(kWHAT, path, info.geometry, expected);
    if (info.pageCount != pageCount)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: '{}' holds {} pages; the destination list has {}", kWHAT, path, info.pageCount, pageCount));
    }

    // Everything is read and verified before the first page is written: a bad file leaves the destination as it was.
    int64_t const bodyBytes = pageCount * (kCHECKSUM_BYTES + info.geometry.bytesPerPage);
    std::vector<char> body(static_cast<size_t>(bodyBytes));
    int64_t const got = readAll(fd.get(), body.data(), bodyBytes);
    if (got < 0)
    {
        throw Error(ioMessage(kWHAT, "read", path, static_cast<int>(-got)));
    }
    if (got < bodyBytes)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: '{}' is truncated: {} bytes follow the header; it promises {}", kWHAT, path, got, bodyBytes));
    }
    char const* const data = body.data() + pageCount * kCHECKSUM_BYTES;
    for (int64_t i = 0; i < pageCount; ++i)
    {
        auto const stored = get<uint64_t>(body, i * kCHECKSUM_BYTES);
        uint64_t const computed = pageChecksum(data + i * info.geometry.bytesPerPage, info.geometry.bytesPerPage, i);
        if (stored != computed)
        {
            throw InvalidArgumentError(
                fmt::format("{}: '{}' page {} of {} is corrupt: its checksum is {:#018x}; its bytes hash to {:#018x}",
                    kWHAT, path, i, pageCount, stored, computed));
        }
    }
    for (int64_t i = 0; i < pageCount; ++i)
    {
        std::memcpy(pages[i], data + i * info.geometry.bytesPerPage, static_cast<size_t>(info.geometry.bytesPerPage));
    }
    return info.tokenCount;
}

} // namespace kvcache::rt
