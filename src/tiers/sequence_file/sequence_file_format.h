#pragma once

// The sequence file's bytes: the header's encoding and checks, the geometry rules and the page checksums. No file I/O
// (sequence_file.cpp reads and writes the files).

#include "tiers/sequence_file/sequence_file_scales.h"
#include "tiers/sequence_file/sequence_file_states.h"

#include "kvcache/core/page_geometry.h"
#include "kvcache/tiers/sequence_file.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kvcache::rt::detail
{

//! Bytes of the fixed part of the header, before the layer records.
constexpr int64_t kSEQUENCE_FIXED_HEADER_BYTES = 56;
//! Bytes of one checksum (the header's and each page's).
constexpr int64_t kSEQUENCE_CHECKSUM_BYTES = 8;

//! Writes `value` at byte `offset` of `out` as memory holds it (the format is little-endian).
template <typename T>
void writeAt(std::vector<char>& out, int64_t offset, T value)
{
    std::memcpy(out.data() + offset, &value, sizeof(T));
}

//! Returns the value at byte `offset` of `in`, as writeAt wrote it.
template <typename T>
T readAt(std::vector<char> const& in, int64_t offset)
{
    T value;
    std::memcpy(&value, in.data() + offset, sizeof(T));
    return value;
}

//! Returns the bytes of a header of `version` before its state records: the fixed part, `numLayers` layer records and,
//! from version 3, the state tensor count and a reserved int32.
int64_t sequenceHeaderBytesBeforeStates(uint32_t version, int64_t numLayers);
//! Returns the bytes of a header of `version` with `numLayers` layers and `numStateTensors` state tensor records (0
//! for version 2), its checksum included.
int64_t sequenceHeaderBytes(uint32_t version, int64_t numLayers, int64_t numStateTensors);
//! Returns the version a header (at least its fixed part) records.
uint32_t sequenceHeaderVersion(std::vector<char> const& header);
//! Returns the state tensor count of a version 3 header read up to its state records (sequenceHeaderBytesBeforeStates
//! bytes). Throws InvalidArgumentError naming the field, the value and the limit for a count outside
//! [0, kMAX_FILE_STATE_TENSORS] or a reserved field other than 0.
int32_t decodeStateCount(char const* what, std::string const& path, std::vector<char> const& header, int32_t numLayers);

//! Returns the checksum of page `index` of `bytes` bytes at `page`.
uint64_t sequencePageChecksum(void const* page, int64_t bytes, int64_t index);
//! Returns the checksum stored at `offset` of `bytes`.
uint64_t storedChecksum(std::vector<char> const& bytes, int64_t offset);

//! Throws InvalidArgumentError, naming `prefix` then the field, its value and the limit, for a geometry a file
//! cannot hold: what computeLayout refuses in a page group's layers (a data type that is not a KV cache type,
//! tokensPerPage not a power of two in [1, kMAX_TOKENS_PER_PAGE], a negative slidingWindow, a layer kind other than
//! kKV or kLATENT, numKVHeads or headDim <= 0, a latent layer of other than one head, a quantization outside the
//! enumeration or one its dataType or a headDim cannot hold), no layers or more than a file holds, page bytes that
//! leave int64, or bytesPerPage other than the layers imply (data and scale bytes).
void checkFileGeometry(std::string const& prefix, PageGeometry const& geometry);

//! Returns the bytes of a file of `pageCount` pages of `bytesPerPage` bytes after a header of `headerBytes`, and a
//! state of `stateBytes` (with its checksum; none for 0) (each >= 0), or -1 when they leave int64.
int64_t sequenceFileBytes(int64_t headerBytes, int64_t bytesPerPage, int64_t pageCount, int64_t stateBytes);

//! Returns the most tokens `pageCount` pages of `geometry` hold: pageCount * tokensPerPage for full attention,
//! int64's largest value for a sliding window (its sequence may be longer than its pages) or when the product leaves
//! int64.
int64_t sequenceTokenLimit(PageGeometry const& geometry, int64_t pageCount);

//! Returns the whole header (magic, version, geometry, counts, layer records with the host-held scales `layerScales`,
//! checksum) of a file of `pageCount` pages and `tokenCount` tokens; `layerScales` has passed checkLayerScales.
//! The header is version kSEQUENCE_FILE_VERSION's, with `stateTensors` (checked by checkStateTensors) recorded.
std::vector<char> encodeSequenceHeader(PageGeometry const& geometry, std::vector<LayerScales> const& layerScales,
    int64_t pageCount, int64_t tokenCount, std::vector<SequenceStateTensor> const& stateTensors);

//! Checks the fixed part of a header (kSEQUENCE_FIXED_HEADER_BYTES bytes of `path`: magic, a version in
//! [kSEQUENCE_FILE_OLDEST_VERSION, kSEQUENCE_FILE_VERSION], layer count) and returns the layer count. Throws
//! InvalidArgumentError naming the field, the value and the limit.
int32_t decodeFixedHeader(char const* what, std::string const& path, std::vector<char> const& fixed);

//! Checks the whole header of `path` (its checksum, the geometry, the counts, and that the file's `fileBytes` are what
//! the header promises) and returns what it says. Throws InvalidArgumentError naming the field, the value and the
//! limit.
SequenceFileInfo decodeSequenceHeader(
    char const* what, std::string const& path, std::vector<char> const& header, int64_t fileBytes);

//! Throws InvalidArgumentError naming the first field where the file's geometry differs from `expected` (the
//! quantization first), with the file's value and the expected one.
void expectGeometry(char const* what, std::string const& path, PageGeometry const& file, PageGeometry const& expected);

} // namespace kvcache::rt::detail
