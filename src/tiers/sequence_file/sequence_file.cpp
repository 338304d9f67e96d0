// Sequence files on disk: written atomically, read and verified whole before any page is written (the bytes' format
// is in sequence_file_format.cpp).

#include "kvcache/tiers/sequence_file.h"

#include "tiers/sequence_file/sequence_file_format.h"

#include "kvcache/core/errors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>

namespace kvcache::rt
{
namespace
{

using detail::kSEQUENCE_CHECKSUM_BYTES;
using detail::kSEQUENCE_FIXED_HEADER_BYTES;

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
    std::vector<char> header(static_cast<size_t>(kSEQUENCE_FIXED_HEADER_BYTES));
    int64_t got = readAll(fd, header.data(), kSEQUENCE_FIXED_HEADER_BYTES);
    if (got < 0)
    {
        throw Error(ioMessage(what, "read", path, static_cast<int>(-got)));
    }
    if (got < kSEQUENCE_FIXED_HEADER_BYTES)
    {
        throw InvalidArgumentError(
            fmt::format("{}: '{}' is truncated: file size is {} bytes; a header needs at least {}", what, path,
                fileBytes, kSEQUENCE_FIXED_HEADER_BYTES));
    }
    int32_t const numLayers = detail::decodeFixedHeader(what, path, header);
    uint32_t const version = detail::sequenceHeaderVersion(header);
    // Read up to a given size of header: the layer records (and a version 3 header's state count), then the rest.
    auto const readTo = [&](int64_t bytes)
    {
        int64_t const before = static_cast<int64_t>(header.size());
        header.resize(static_cast<size_t>(bytes));
        int64_t const part = readAll(fd, header.data() + before, bytes - before);
        if (part < 0)
        {
            throw Error(ioMessage(what, "read", path, static_cast<int>(-part)));
        }
        if (part < bytes - before)
        {
            throw InvalidArgumentError(fmt::format(
                "{}: '{}' is truncated: file size is {} bytes; its header needs {}", what, path, fileBytes, bytes));
        }
    };
    int32_t numStateTensors = 0;
    if (version >= 3)
    {
        readTo(detail::sequenceHeaderBytesBeforeStates(version, numLayers));
        numStateTensors = detail::decodeStateCount(what, path, header, numLayers);
    }
    int64_t const allHeaderBytes = detail::sequenceHeaderBytes(version, numLayers, numStateTensors);
    readTo(allHeaderBytes);
    OpenedFile opened{};
    opened.info = detail::decodeSequenceHeader(what, path, header, fileBytes);
    opened.headerBytes = allHeaderBytes;
    return opened;
}

} // namespace

void writeSequenceFile(std::string const& path, PageGeometry const& geometry, int64_t tokenCount,
    void const* const* pages, int64_t pageCount, std::vector<LayerScales> const& layerScales,
    std::vector<SequenceStateTensor> const& stateTensors, void const* state)
{
    constexpr char const* kWHAT = "writeSequenceFile";
    std::string const prefix = fmt::format("{}: ", kWHAT);
    detail::checkFileGeometry(prefix, geometry);
    detail::checkLayerScales(prefix, "layerScales", geometry, layerScales);
    int64_t const stateBytes = detail::checkStateTensors(prefix, "stateTensors", stateTensors);
    if ((state == nullptr) != stateTensors.empty())
    {
        throw InvalidArgumentError(fmt::format("{}: state is {} with {} state tensors; a state needs its tensors and "
                                               "tensors their state",
            kWHAT, state == nullptr ? "null" : "given", stateTensors.size()));
    }
    if (pageCount < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: pageCount is {}; it must be >= 0", kWHAT, pageCount));
    }
    int64_t const headerBytes = detail::sequenceHeaderBytes(kSEQUENCE_FILE_VERSION,
        static_cast<int64_t>(geometry.layers.size()), static_cast<int64_t>(stateTensors.size()));
    if (detail::sequenceFileBytes(headerBytes, geometry.bytesPerPage, pageCount, stateBytes) < 0)
    {
        throw InvalidArgumentError(
            fmt::format("{}: pageCount is {}; with pages of {} bytes the file size overflows 64 bits (limit {})", kWHAT,
                pageCount, geometry.bytesPerPage, std::numeric_limits<int64_t>::max()));
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
    int64_t const maxTokens = detail::sequenceTokenLimit(geometry, pageCount);
    if (tokenCount < 0 || tokenCount > maxTokens)
    {
        throw InvalidArgumentError(
            fmt::format("{}: tokenCount is {}; it must be in [0, {}]", kWHAT, tokenCount, maxTokens));
    }

    std::vector<char> const header =
        detail::encodeSequenceHeader(geometry, layerScales, pageCount, tokenCount, stateTensors);
    std::vector<uint64_t> checksums(static_cast<size_t>(pageCount));
    for (int64_t i = 0; i < pageCount; ++i)
    {
        checksums[static_cast<size_t>(i)] = detail::sequencePageChecksum(pages[i], geometry.bytesPerPage, i);
    }
    if (stateBytes > 0)
    {
        // The state's checksum follows the pages', seeded as the next record's would be.
        checksums.push_back(detail::sequencePageChecksum(state, stateBytes, pageCount));
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
        error = writeAll(fd.get(), checksums.data(), static_cast<int64_t>(checksums.size()) * kSEQUENCE_CHECKSUM_BYTES);
    }
    for (int64_t i = 0; i < pageCount && error == 0; ++i)
    {
        error = writeAll(fd.get(), pages[i], geometry.bytesPerPage);
    }
    if (error == 0 && stateBytes > 0)
    {
        error = writeAll(fd.get(), state, stateBytes);
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

int64_t readSequenceFile(std::string const& path, PageGeometry const& expected, void* const* pages, int64_t pageCount,
    std::vector<LayerScales> const& expectedScales, std::vector<SequenceStateTensor> const& expectedStateTensors,
    void* state)
{
    constexpr char const* kWHAT = "readSequenceFile";
    detail::checkLayerScales(fmt::format("{}: ", kWHAT), "expectedScales", expected, expectedScales);
    detail::checkStateTensors(fmt::format("{}: ", kWHAT), "expectedStateTensors", expectedStateTensors);
    if ((state == nullptr) != expectedStateTensors.empty())
    {
        throw InvalidArgumentError(fmt::format("{}: state is {} with {} expected state tensors; a state needs its "
                                               "tensors and tensors their state",
            kWHAT, state == nullptr ? "null" : "given", expectedStateTensors.size()));
    }
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
    detail::expectGeometry(kWHAT, path, info.geometry, expected);
    if (info.pageCount != pageCount)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: '{}' holds {} pages; the destination list has {}", kWHAT, path, info.pageCount, pageCount));
    }
    detail::expectLayerScales(kWHAT, path, info.geometry, info.layerScales, expectedScales);
    if (!expectedStateTensors.empty())
    {
        detail::expectStateTensors(kWHAT, path, info.stateTensors, expectedStateTensors);
    }

    // Everything is read and verified before the first page is written: a bad file leaves the destination as it was.
    // The header bounded the sizes (sequenceFileBytes), so these products fit.
    int64_t const checksumCount = pageCount + (info.stateBytes > 0 ? 1 : 0);
    int64_t const bodyBytes =
        checksumCount * kSEQUENCE_CHECKSUM_BYTES + pageCount * info.geometry.bytesPerPage + info.stateBytes;
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
    char const* const data = body.data() + checksumCount * kSEQUENCE_CHECKSUM_BYTES;
    char const* const stateData = data + pageCount * info.geometry.bytesPerPage;
    if (info.stateBytes > 0)
    {
        auto const stored = detail::storedChecksum(body, pageCount * kSEQUENCE_CHECKSUM_BYTES);
        uint64_t const computed = detail::sequencePageChecksum(stateData, info.stateBytes, pageCount);
        if (stored != computed)
        {
            throw InvalidArgumentError(
                fmt::format("{}: '{}' state is corrupt: its checksum is {:#018x}; its bytes hash to {:#018x}", kWHAT,
                    path, stored, computed));
        }
    }
    for (int64_t i = 0; i < pageCount; ++i)
    {
        auto const stored = detail::storedChecksum(body, i * kSEQUENCE_CHECKSUM_BYTES);
        uint64_t const computed =
            detail::sequencePageChecksum(data + i * info.geometry.bytesPerPage, info.geometry.bytesPerPage, i);
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
    if (state != nullptr)
    {
        std::memcpy(state, stateData, static_cast<size_t>(info.stateBytes));
    }
    return info.tokenCount;
}

} // namespace kvcache::rt
