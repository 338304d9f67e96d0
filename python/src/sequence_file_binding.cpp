// Sequence files: over a tier's host pages (save_sequence, load_sequence) and over host buffers
// (write_sequence_file, read_sequence_file), and a file's header.

#include "bindings.h"
#include "cuda_arguments.h"
#include "host_tier_handle.h"

#include <kvcache/core/errors.h>
#include <kvcache/tiers/host_tier.h>
#include <kvcache/tiers/sequence_file.h>

#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvcache::python
{
namespace
{

//! Reads the host pages of a sequence-file call into the tier's scratch list; returns their count.
int64_t hostPagesArgument(TierHandle& handle, nb::handle hostPages)
{
    hostInt32s(hostPages, handle.hostPages, "host_pages", "host pages");
    return static_cast<int64_t>(handle.hostPages.size());
}

using ReadOnlyBuffer = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using WritableBuffer = nb::ndarray<nb::c_contig, nb::device::cpu>;

//! Returns the bytes of `array` (elements times element size).
template <typename Array>
int64_t bufferBytes(Array const& array)
{
    return static_cast<int64_t>(array.size()) * ((array.dtype().bits * array.dtype().lanes + 7) / 8);
}

//! Reads `pages`, a sequence of C-contiguous host buffers of `bytesPerPage` bytes each (NumPy arrays, rows of a 2-D
//! array, bytes-like objects; writable when `Writable`), into `arrays` (which hold them for the call) and their
//! addresses into `addresses`. Throws TypeError for what is no such sequence or buffer, InvalidArgumentError for a
//! buffer of another size, a read-only one where a writable one is needed, or a non-contiguous one.
template <bool Writable>
void hostPageBuffers(nb::handle pages, int64_t bytesPerPage,
    std::vector<std::conditional_t<Writable, WritableBuffer, ReadOnlyBuffer>>& arrays,
    std::vector<std::conditional_t<Writable, void*, void const*>>& addresses)
{
    char const* const expected = Writable ? "a writable C-contiguous host array of bytes_per_page bytes"
                                          : "a C-contiguous host array or bytes-like object of bytes_per_page bytes";
    requireIterable(pages, "pages", "a sequence of host arrays, one a page");
    size_t index = 0;
    for (nb::handle page : pages)
    {
        std::string const field = fmt::format("pages[{}]", index);
        std::conditional_t<Writable, WritableBuffer, ReadOnlyBuffer> array;
        if (!nb::try_cast(page, array, false))
        {
            nb::ndarray<nb::ro> any;
            if (!nb::try_cast(page, any, false))
            {
                throwTypeError(page, field.c_str(), expected);
            }
            ReadOnlyBuffer readOnly;
            bool const isReadOnly = Writable && nb::try_cast(page, readOnly, false);
            throw rt::InvalidArgumentError(fmt::format("{} is {}; it must be {}", field,
                isReadOnly ? "read-only" : "not a C-contiguous host array (another layout or device)", expected));
        }
        if (bufferBytes(array) != bytesPerPage)
        {
            throw rt::InvalidArgumentError(
                fmt::format("{} has {} bytes; a page of this geometry has {} (bytes_per_page)", field,
                    bufferBytes(array), bytesPerPage));
        }
        addresses.push_back(array.data());
        arrays.push_back(std::move(array));
        ++index;
    }
}

void writeSequenceFile(nb::handle path, rt::PageGeometry const& geometry, int64_t tokenCount, nb::handle pages)
{
    std::string const file = pathArgument(path, "path");
    std::vector<ReadOnlyBuffer> arrays;
    std::vector<void const*> addresses;
    hostPageBuffers<false>(pages, geometry.bytesPerPage, arrays, addresses);
    rt::writeSequenceFile(file, geometry, tokenCount, addresses.data(), static_cast<int64_t>(addresses.size()));
}

int64_t readSequenceFile(nb::handle path, rt::PageGeometry const& expected, nb::handle pages)
{
    std::string const file = pathArgument(path, "path");
    std::vector<WritableBuffer> arrays;
    std::vector<void*> addresses;
    hostPageBuffers<true>(pages, expected.bytesPerPage, arrays, addresses);
    return rt::readSequenceFile(file, expected, addresses.data(), static_cast<int64_t>(addresses.size()));
}

} // namespace

void bindSequenceFiles(nb::module_& m)
{
    m.attr("SEQUENCE_FILE_VERSION") = rt::kSEQUENCE_FILE_VERSION;
    m.attr("SEQUENCE_FILE_OLDEST_VERSION") = rt::kSEQUENCE_FILE_OLDEST_VERSION;

    // The functions' signatures are written out (nb::sig): their arguments take None only for the sake of its
    // TypeError message, and the types they accept are the stub's aliases.

    nb::class_<rt::SequenceStateTensor>(m, "SequenceStateTensor",
        "One state tensor of a sequence file's state: one state slot of state layer `state_layer`'s tensor `tensor`.")
        .def_ro("state_layer", &rt::SequenceStateTensor::stateLayer)
        .def_ro("tensor", &rt::SequenceStateTensor::tensor)
        .def_ro("data_type", &rt::SequenceStateTensor::dataType)
        .def_ro("shape", &rt::SequenceStateTensor::shape, "One slot's shape.")
        .def_ro("slot_bytes", &rt::SequenceStateTensor::slotBytes);

    nb::class_<rt::SequenceFileInfo>(m, "SequenceFileInfo", "What a sequence file's header says.")
        .def_ro("version", &rt::SequenceFileInfo::version)
        .def_ro("geometry", &rt::SequenceFileInfo::geometry)
        .def_ro("page_count", &rt::SequenceFileInfo::pageCount)
        .def_ro("token_count", &rt::SequenceFileInfo::tokenCount)
        .def_ro("layer_scales", &rt::SequenceFileInfo::layerScales,
            "The host-held scales the pages were written under, a LayerScales a layer of the geometry, for "
            "FP8_PER_TENSOR and NVFP4 (a latent layer's v is 0, not compared, and taken back by set_layer_scales); "
            "empty for the other quantizations. Set them with KVCacheManager.set_layer_scales before "
            "load_sequence into a cache whose scales differ.")
        .def_ro("state_tensors", &rt::SequenceFileInfo::stateTensors,
            "The state tensors of the sequence's state slot the file holds, in packed order (state layers in order, "
            "each layer's tensors in config order); empty when it holds no state (every version 2 file).")
        .def_ro("state_bytes", &rt::SequenceFileInfo::stateBytes, "Bytes of the file's state (0 without one).");

    m.def(
        "save_sequence",
        [](nb::handle path, nb::handle tier, nb::handle hostPages, int64_t tokenCount, std::optional<int64_t> hostState)
        {
            std::string const file = pathArgument(path, "path");
            TierHandle& handle = tierArgument(tier);
            int64_t const count = hostPagesArgument(handle, hostPages);
            if (hostState)
            {
                rt::saveSequence(file, handle.tier(), handle.manager(), handle.hostPages.data(), count, tokenCount,
                    toInt32(*hostState, "host_state"));
                return;
            }
            rt::saveSequence(file, handle.tier(), handle.manager(), handle.hostPages.data(), count, tokenCount);
        },
        nb::arg("path").none(), nb::arg("tier").none(), nb::arg("host_pages").none(), nb::arg("token_count"),
        nb::kw_only(), nb::arg("host_state") = nb::none(),
        nb::sig("def save_sequence(path: PathLike, tier: HostTier, host_pages: HostIds, token_count: int, *, "
                "host_state: int | None = None) -> None"),
        "Writes host pages `host_pages` of `tier` (in that order) and `token_count` to a sequence file at `path` (str "
        "or os.PathLike), after waiting for the tier's transfers touching them: versioned, checksummed, written "
        "atomically (a temporary file renamed over `path`), with the cache's quantization and host-held layer scales. "
        "Raises InvalidArgumentError for a token count outside "
        "[0, len(host_pages) * tokens_per_page] (full attention), OutOfRangeError for a bad host page, RuntimeError "
        "when the file cannot be written (nothing is left behind). With `host_state`, the tier's host state of that "
        "index (a sequence's state slot, offload_states) is saved with the pages, recorded with the cache's state "
        "tensors; InvalidArgumentError for a cache without state layers, OutOfRangeError for a host state outside "
        "[0, tier.num_host_states()).");
    m.def(
        "load_sequence",
        [](nb::handle path, nb::handle tier, nb::handle hostPages, std::optional<int64_t> hostState)
        {
            std::string const file = pathArgument(path, "path");
            TierHandle& handle = tierArgument(tier);
            handle.refuseIfLent("load_sequence");
            int64_t const count = hostPagesArgument(handle, hostPages);
            if (hostState)
            {
                return rt::loadSequence(file, handle.tier(), handle.manager(), handle.hostPages.data(), count,
                    toInt32(*hostState, "host_state"));
            }
            return rt::loadSequence(file, handle.tier(), handle.manager(), handle.hostPages.data(), count);
        },
        nb::arg("path").none(), nb::arg("tier").none(), nb::arg("host_pages").none(), nb::kw_only(),
        nb::arg("host_state") = nb::none(),
        nb::sig("def load_sequence(path: PathLike, tier: HostTier, host_pages: HostIds, *, host_state: int | None = "
                "None) -> int"),
        "Reads the sequence file at `path` into host pages `host_pages` of `tier` and returns its token count. The "
        "whole file is verified before any host page is written: another geometry (quantization included), host-held "
        "layer scales other than the cache's, a count other than the file's page count, a format version older than "
        "SEQUENCE_FILE_OLDEST_VERSION, a truncated or corrupt file, a host page listed twice raise "
        "InvalidArgumentError, a bad host page OutOfRangeError, and every host page keeps its bytes. RuntimeError when "
        "the file cannot be read; InvalidArgumentError for a tier lent by a TieredPrefixCache (its host pages are the "
        "tiered cache's). With `host_state`, the file's state goes into the tier's host state of that index "
        "(onboard_states moves it to a slot), verified with the pages: a file holding no state (version 2 files "
        "included) or other state tensors than the cache's raise InvalidArgumentError and leave the host state as it "
        "was. Without it, a file's state is verified but not read out.");
    m.def(
        "read_sequence_file_info", [](nb::handle path) { return rt::readSequenceFileInfo(pathArgument(path, "path")); },
        nb::arg("path").none(), nb::sig("def read_sequence_file_info(path: PathLike) -> SequenceFileInfo"),
        "Reads and checks the header of the sequence file at `path` (its page count sizes the host pages to load "
        "it into). Raises RuntimeError when it cannot be read, InvalidArgumentError naming the field for a file that "
        "is not a sequence file, of a version this build does not read, corrupt or truncated.");
    m.def("write_sequence_file", &writeSequenceFile, nb::arg("path").none(), nb::arg("geometry"),
        nb::arg("token_count"), nb::arg("pages").none(),
        nb::sig("def write_sequence_file(path: PathLike, geometry: PageGeometry, token_count: int, pages: "
                "HostPageBuffers) -> None"),
        "Writes `pages` (a sequence of C-contiguous host arrays or bytes-like objects of geometry.bytes_per_page "
        "bytes each, e.g. the rows of a uint8 [n, bytes_per_page] array) and `token_count` to a sequence file at "
        "`path`, atomically, as save_sequence does for host pages of a tier (without a state).");
    m.def("read_sequence_file", &readSequenceFile, nb::arg("path").none(), nb::arg("expected"), nb::arg("pages").none(),
        nb::sig("def read_sequence_file(path: PathLike, expected: PageGeometry, pages: HostPageBuffers) -> int"),
        "Reads the sequence file at `path` into `pages` (writable C-contiguous host arrays of "
        "expected.bytes_per_page bytes each, as many as the file's pages) and returns its token count; the whole "
        "file is verified first, so a bad file (or another geometry than `expected`) raises InvalidArgumentError "
        "and writes no page.");
}

} // namespace kvcache::python
