#pragma once

#include "kvcache/core/page_geometry.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt
{

//! What a sequence file's header says.
struct SequenceFileInfo
{
    uint32_t version = 0;
    PageGeometry geometry = {};
    int64_t pageCount = 0;
    int64_t tokenCount = 0;
};

//! The format version this build writes and the only one it reads.
inline constexpr uint32_t kSEQUENCE_FILE_VERSION = 1;

//! Writes `pageCount` pages (each `geometry.bytesPerPage` bytes at `pages[i]`, host memory) and `tokenCount` to
//! `path`, atomically: the bytes go to a temporary file in the same folder, flushed to disk, then renamed over
//! `path`, so a reader sees the old file or the whole new one, never a part. The format (little-endian): a header
//! (magic "KVCSEQF\0", version, geometry, page and token counts) closed by its XXH3-64 checksum, then one XXH3-64
//! checksum a page (seeded with the page's index, so swapped pages fail too), then the pages. XXH3 finds accidental
//! corruption, not tampering. Throws InvalidArgumentError, naming the field, the value and the limit, for a geometry
//! computeLayout would not give a page group (tokensPerPage not a power of two in [1, kMAX_TOKENS_PER_PAGE], a
//! negative slidingWindow, a bad layer; or bytesPerPage other than the layers imply), a negative count, a file size
//! beyond int64, a null page or a token count outside [0, pageCount * tokensPerPage] (full attention; a windowed
//! group's sequence may be longer than its pages), and Error when the file cannot be written (nothing is left behind
//! then).
void writeSequenceFile(std::string const& path, PageGeometry const& geometry, int64_t tokenCount,
    void const* const* pages, int64_t pageCount);

//! Reads and checks the header of the file at `path` (magic, version, its checksum, the size the header promises).
//! Every header field is bounded as writeSequenceFile bounds it (and reserved bytes must be 0) before any size is
//! computed from it, and sizes are computed checked in 64 bits. Throws Error when the file cannot be read and
//! InvalidArgumentError, naming the field, the value and the limit, for a file that is not a sequence file, of another
//! version, corrupt (a field out of range even under a matching checksum) or truncated.
SequenceFileInfo readSequenceFileInfo(std::string const& path);

//! Reads the file at `path` into `pageCount` host pages (`pages[i]`, each `expected.bytesPerPage` bytes) and returns
//! its token count. All of the file is read and every checksum verified in a scratch buffer first, so a bad file
//! writes no page. Throws as readSequenceFileInfo, and InvalidArgumentError naming the field, the file's value and
//! the expected one when the file's geometry differs from `expected` or its page count from `pageCount`, or for a
//! page whose checksum does not match (naming the page).
int64_t readSequenceFile(std::string const& path, PageGeometry const& expected, void* const* pages, int64_t pageCount);

} // namespace kvcache::rt
