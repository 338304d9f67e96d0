#pragma once

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt
{

//! One state tensor of a sequence file's state: one state slot of the tensor, as the layout describes it.
struct SequenceStateTensor
{
    int32_t stateLayer = 0; //!< index into KVCacheLayout::stateLayers
    int32_t tensor = 0;     //!< index into the layer's tensors
    DataType dataType = DataType::kFLOAT;
    std::vector<int64_t> shape = {}; //!< one slot's shape (StateTensorLayout::shape), 1 to kMAX_STATE_DIMS extents
    int64_t slotBytes = 0;           //!< the product of the shape times the element's bytes
};

//! Returns the state tensors of one state slot of `layout` in the order a packed state slot holds them (a host tier's
//! host state, a sequence file's state): state layers in order, each layer's tensors in config order. Empty without
//! state layers.
std::vector<SequenceStateTensor> sequenceStateTensors(KVCacheLayout const& layout);

//! What a sequence file's header says.
struct SequenceFileInfo
{
    uint32_t version = 0;
    PageGeometry geometry = {};
    int64_t pageCount = 0;
    int64_t tokenCount = 0;
    //! The host-held scales the pages were written under, one a layer of the geometry in order, for a quantization
    //! that keeps them (kFP8_PER_TENSOR, kNVFP4); empty for the others. A latent layer's `v` is 0 (it has no V).
    std::vector<LayerScales> layerScales = {};
    //! The state tensors of the sequence's state slot the file holds, in packed order; empty when it holds no state
    //! (every version 2 file).
    std::vector<SequenceStateTensor> stateTensors = {};
    int64_t stateBytes = 0; //!< the sum of the state tensors' slotBytes: the bytes of the file's state
};

//! The format version this build writes. Version 3 adds a sequence's state slot (a header record a state tensor, the
//! state's bytes after the pages); version 2 files (no state) are still read, as files holding no state. Version 2
//! recorded the quantization and the host-held scales; version 1 files (no quantization) are refused.
inline constexpr uint32_t kSEQUENCE_FILE_VERSION = 3;
//! The oldest format version this build reads.
inline constexpr uint32_t kSEQUENCE_FILE_OLDEST_VERSION = 2;

//! Writes `pageCount` pages (each `geometry.bytesPerPage` bytes at `pages[i]`, host memory: a host page's bytes,
//! data then scale pages, see PageGeometry), `tokenCount` and `layerScales` to `path`, atomically: the bytes go to a
//! temporary file in the same folder, flushed to disk, then renamed over `path`, so a reader sees the old file or the
//! whole new one, never a part. The format (little-endian, docs/layout.md "Sequence files"): a header (magic
//! "KVCSEQF\0", version, geometry with its quantization, page and token counts, a record a layer with its host-held
//! scales) closed by its XXH3-64 checksum, then one XXH3-64 checksum a page (seeded with the page's index, so swapped
//! pages fail too), then the pages. XXH3 finds accidental corruption, not tampering. `layerScales` holds one entry a
//! layer of the geometry for kFP8_PER_TENSOR (finite, >= 0) and kNVFP4 (finite, > 0), a latent layer's `v` unused
//! (written as 0), and is empty for the other quantizations. Throws InvalidArgumentError, naming the field, the value
//! and the limit, for a geometry computeLayout would not give a page group (tokensPerPage not a power of two in [1,
//! kMAX_TOKENS_PER_PAGE], a negative slidingWindow, a bad layer, a quantization its dataType or a headDim cannot
//! hold; or bytesPerPage other than the layers imply, scales included), layerScales of another count or a bad scale,
//! a negative count, a file size beyond int64, a null page or a token count outside [0, pageCount * tokensPerPage]
//! (full attention; a windowed group's sequence may be longer than its pages), and Error when the file cannot be
//! written (nothing is left behind then).
//!
//! With `stateTensors` (from sequenceStateTensors) the file also holds a state slot: `state` (host memory, the sum of
//! their slotBytes, packed in their order), recorded in the header (a record a tensor: its state layer and index, data
//! type, shape and slotBytes) and written after the pages under a checksum of its own. Throws InvalidArgumentError,
//! naming the field, for a state tensor sequenceStateTensors would not give (out of order, a bad data type or shape,
//! slotBytes other than the shape implies) and for a null `state` with state tensors or a state without them.
void writeSequenceFile(std::string const& path, PageGeometry const& geometry, int64_t tokenCount,
    void const* const* pages, int64_t pageCount, std::vector<LayerScales> const& layerScales = {},
    std::vector<SequenceStateTensor> const& stateTensors = {}, void const* state = nullptr);

//! Reads and checks the header of the file at `path` (magic, version, its checksum, the size the header promises).
//! Every header field is bounded as writeSequenceFile bounds it (and reserved bytes must be 0) before any size is
//! computed from it, and sizes are computed checked in 64 bits. Throws Error when the file cannot be read and
//! InvalidArgumentError, naming the field, the value and the limit, for a file that is not a sequence file, of another
//! version (version 1 included), corrupt (a field out of range even under a matching checksum) or truncated.
SequenceFileInfo readSequenceFileInfo(std::string const& path);

//! Reads the file at `path` into `pageCount` host pages (`pages[i]`, each `expected.bytesPerPage` bytes) and returns
//! its token count. All of the file is read and every checksum verified in a scratch buffer first, so a bad file
//! writes no page. `expectedScales` follows writeSequenceFile's rules for `layerScales` (checked before the file is
//! opened). Throws as readSequenceFileInfo, and InvalidArgumentError naming the field, the file's value and the
//! expected one when the file's geometry (its quantization included) differs from `expected`, its page count from
//! `pageCount` or its host-held scales from `expectedScales` (bit for bit; a latent layer's `v` is not compared),
//! or for a page whose checksum does not match (naming the page).
//!
//! With `expectedStateTensors` the file's state is read into `state` (their slotBytes summed, host memory), verified
//! with the pages before anything is written: a file holding no state (a version 2 file included) or state tensors
//! other than the expected ones (compared field by field) throws InvalidArgumentError naming the field, the file's
//! value and the expected one. Without them a file's state is verified but not read out.
int64_t readSequenceFile(std::string const& path, PageGeometry const& expected, void* const* pages, int64_t pageCount,
    std::vector<LayerScales> const& expectedScales = {},
    std::vector<SequenceStateTensor> const& expectedStateTensors = {}, void* state = nullptr);

} // namespace kvcache::rt
