// HostTier (pinned host pages of one page group: offload, onboard, host page views), page geometries and sequence
// files (over a tier's host pages, and over host buffers).

#include "bindings.h"
#include "cuda_arguments.h"
#include "dlpack_view.h"
#include "write_binding.h"

#include <kvcache/errors.h>
#include <kvcache/host_tier.h>
#include <kvcache/sequence_file.h>

#include <fmt/format.h>
#include <nanobind/ndarray.h>
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

//! A HostTier and the KVCacheManager object it moves pages of, which it keeps alive: the manager goes after the tier
//! (declared first), so the tier never outlives the cache it was made for.
class TierHandle
{
public:
    TierHandle(nb::handle cache, int64_t group, int64_t numHostPages, rt::HostTierOptions const& options)
        : mCacheObject(nb::borrow(cache))
        , mCache(cacheAccess(cache))
        , mTier(*mCache.manager, toInt32(group, "group"), numHostPages, options)
    {
    }

    rt::HostTier& tier() noexcept
    {
        return mTier;
    }
    rt::KVCacheManager const& manager() const noexcept
    {
        return *mCache.manager;
    }
    //! The stream transfers run on when the call names none: the cache's.
    cudaStream_t cacheStream() const noexcept
    {
        return mCache.stream;
    }
    //! Host lists are read into these, reused between calls so that a call allocates nothing in steady state.
    std::vector<rt::HostTierEntry> entries;
    std::vector<int32_t> hostPages;

private:
    nb::object mCacheObject;
    CacheAccess mCache;
    rt::HostTier mTier;
};

using Self = nb::pointer_and_handle<TierHandle>;

constexpr PairListName kENTRIES{"entries", "ids", "(page, host_page)"};

//! Offloads (toHost) or onboards the entries: a host list through the checked C++ call, or a device int32 array
//! ([n, 2] or [2n]) through the device-list call, with the kernel. Returns the method used.
rt::HostTierMethod transfer(TierHandle& handle, bool toHost, nb::handle entries, nb::handle stream,
    rt::HostTierMethod method, nb::handle count, nb::handle errorCount)
{
    cudaStream_t const onStream = streamArgument(stream, handle.cacheStream());
    rt::HostTier& tier = handle.tier();
    int32_t const device = tier.device();
    if (std::optional<DeviceInt32Array> const list = deviceInt32Array(entries, onStream, device, "entries"))
    {
        if (list->count % 2 != 0)
        {
            throw rt::InvalidArgumentError(fmt::format(
                "entries has {} int32 values; a device list of (page, host_page) entries has an even number",
                list->count));
        }
        if (method == rt::HostTierMethod::kCOPY_ENGINE)
        {
            throw rt::InvalidArgumentError("method is HostTierMethod.COPY_ENGINE; device lists move with the kernel "
                                           "(HostTierMethod.KERNEL or AUTO)");
        }
        int32_t const capacity = toInt32(list->count / 2, "entries capacity");
        // {page, hostPage} int32 rows are HostTierEntry's layout.
        auto const* const deviceEntries = reinterpret_cast<rt::HostTierEntry const*>(list->data);
        int32_t const* const deviceCount = deviceScalar(count, onStream, device, "count");
        int32_t* const deviceErrorCount = deviceScalar(errorCount, onStream, device, "error_count");
        if (toHost)
        {
            tier.offloadDevice(handle.manager(), deviceEntries, capacity, deviceCount, onStream, deviceErrorCount);
        }
        else
        {
            tier.onboardDevice(handle.manager(), deviceEntries, capacity, deviceCount, onStream, deviceErrorCount);
        }
        return rt::HostTierMethod::kKERNEL;
    }
    requireHostListArguments(count, errorCount, "entries");
    hostInt32Pairs(entries, handle.entries, kENTRIES);
    return toHost ? tier.offload(handle.manager(), handle.entries, onStream, method)
                  : tier.onboard(handle.manager(), handle.entries, onStream, method);
}

//! Returns the path `path` names: a str or an os.PathLike giving one. Throws TypeError otherwise and
//! InvalidArgumentError for a NUL character.
std::string pathArgument(nb::handle path)
{
    nb::object const fsPath = nb::steal(PyOS_FSPath(path.ptr()));
    if (!fsPath.is_valid())
    {
        PyErr_Clear();
        throwTypeError(path, "path", "a str or an os.PathLike");
    }
    if (!nb::isinstance<nb::str>(fsPath))
    {
        throwTypeError(fsPath, "path", "a str (a bytes path is not taken)");
    }
    Py_ssize_t bytes = 0;
    char const* const utf8 = PyUnicode_AsUTF8AndSize(fsPath.ptr(), &bytes);
    if (utf8 == nullptr)
    {
        throw nb::python_error();
    }
    std::string const result(utf8, static_cast<size_t>(bytes));
    if (result.find('\0') != std::string::npos)
    {
        throw rt::InvalidArgumentError("path contains a NUL character");
    }
    return result;
}

//! Returns the tier `tier` is; throws TypeError naming it otherwise.
TierHandle& tierArgument(nb::handle tier)
{
    return *checkedCast<TierHandle*>(tier, "tier", "a HostTier");
}

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
    std::string const file = pathArgument(path);
    std::vector<ReadOnlyBuffer> arrays;
    std::vector<void const*> addresses;
    hostPageBuffers<false>(pages, geometry.bytesPerPage, arrays, addresses);
    rt::writeSequenceFile(file, geometry, tokenCount, addresses.data(), static_cast<int64_t>(addresses.size()));
}

int64_t readSequenceFile(nb::handle path, rt::PageGeometry const& expected, nb::handle pages)
{
    std::string const file = pathArgument(path);
    std::vector<WritableBuffer> arrays;
    std::vector<void*> addresses;
    hostPageBuffers<true>(pages, expected.bytesPerPage, arrays, addresses);
    return rt::readSequenceFile(file, expected, addresses.data(), static_cast<int64_t>(addresses.size()));
}

char const* const kTRANSFER_DOC =
    "entries: (page, host_page) pairs, page a page id of the tier's group in its cache, host_page one of the tier's.\n"
    "A host list (sequence of pairs, [n, 2] int array) is checked before anything is enqueued and moves by `method`\n"
    "(AUTO: the kernel up to HOST_TIER_KERNEL_MAX_BYTES, the copy engine above); returns the method used. A device\n"
    "int32 array ([n, 2] or [2n], __dlpack__ or __cuda_array_interface__) moves with the kernel, which reads it\n"
    "when it runs, so a CUDA graph that captured the call replays with its current contents: entries holding\n"
    "UNUSED_PAGE_ENTRY are skipped, bad ones are skipped and counted in error_count; count / error_count are optional\n"
    "one-element device int32 arrays (device lists only); returns HostTierMethod.KERNEL. Stream-ordered on `stream`\n"
    "(default: the cache's), without a host synchronisation. Host lists raise, before enqueuing anything:\n"
    "OutOfRangeError for a page outside [0, the group's num_pages) or a host page outside\n"
    "[0, num_pinned_host_pages()), InvalidArgumentError for a page or a host page listed twice or a capturing stream\n"
    "(capture the device-list form).";

} // namespace

void bindHostTier(nb::module_& m)
{
    m.attr("HOST_TIER_KERNEL_MAX_BYTES") = rt::kHOST_TIER_KERNEL_MAX_BYTES;
    m.attr("HOST_TIER_MAX_SMS") = rt::kHOST_TIER_MAX_SMS;
    m.attr("HOST_TIER_MAX_CHUNKS") = rt::kHOST_TIER_MAX_CHUNKS;
    m.attr("SEQUENCE_FILE_VERSION") = rt::kSEQUENCE_FILE_VERSION;

    nb::enum_<rt::HostTierMethod>(m, "HostTierMethod", "How a host tier transfer moves its bytes.")
        .value("AUTO", rt::HostTierMethod::kAUTO,
            "The kernel for at most HOST_TIER_KERNEL_MAX_BYTES (count * host_page_bytes), the copy engine above.")
        .value("COPY_ENGINE", rt::HostTierMethod::kCOPY_ENGINE,
            "Staged through the tier's device staging buffer, one copy-engine descriptor a host page.")
        .value("KERNEL", rt::HostTierMethod::kKERNEL,
            "A kernel on at most HOST_TIER_MAX_SMS multiprocessors over the mapped pinned memory (device lists too).");

    nb::class_<rt::PageLayerGeometry>(m, "PageLayerGeometry", "One layer of a page group as its pages hold it.")
        .def_ro("kind", &rt::PageLayerGeometry::kind)
        .def_ro("num_kv_heads", &rt::PageLayerGeometry::numKVHeads)
        .def_ro("head_dim", &rt::PageLayerGeometry::headDim)
        .def(
            "__eq__", [](rt::PageLayerGeometry const& a, rt::PageLayerGeometry const& b) { return a == b; },
            nb::is_operator())
        .def("__repr__",
            [](rt::PageLayerGeometry const& layer)
            {
                return fmt::format("PageLayerGeometry(kind={}, num_kv_heads={}, head_dim={})",
                    layer.kind == rt::KVLayerKind::kLATENT ? "LATENT" : "KV", layer.numKVHeads, layer.headDim);
            });

    nb::class_<rt::PageGeometry>(m, "PageGeometry",
        "What a page of one page group is: one page id's bytes of every layer of the group in layer order, each "
        "layer's K half then its V half (a latent layer: its one half); then, for FP8_PER_TOKEN_HEAD and NVFP4, every "
        "layer's scale pages in the same order. Pages move (host tier, sequence file) only between equal geometries.")
        .def_ro("data_type", &rt::PageGeometry::dataType)
        .def_ro("quantization", &rt::PageGeometry::quantization,
            "How the values are stored and scaled: which scale bytes a page holds.")
        .def_ro("tokens_per_page", &rt::PageGeometry::tokensPerPage)
        .def_ro("sliding_window", &rt::PageGeometry::slidingWindow, "The group's sliding window, 0 for full attention.")
        .def_ro("layers", &rt::PageGeometry::layers, "The group's layers, in order (a copy).")
        .def_ro("bytes_per_page", &rt::PageGeometry::bytesPerPage, "Bytes of one page: the group's bytes_per_page.")
        .def(
            "__eq__", [](rt::PageGeometry const& a, rt::PageGeometry const& b) { return a == b; }, nb::is_operator())
        .def("__repr__",
            [](rt::PageGeometry const& geometry)
            {
                return fmt::format("PageGeometry(data_type={}, quantization={}, tokens_per_page={}, sliding_window={}, "
                                   "layers={}, bytes_per_page={})",
                    rt::dataTypeName(geometry.dataType), rt::kvQuantizationName(geometry.quantization),
                    geometry.tokensPerPage, geometry.slidingWindow, geometry.layers.size(), geometry.bytesPerPage);
            });

    m.def(
        "page_geometry",
        [](rt::KVCacheLayout const& layout, int64_t group)
        { return rt::pageGeometry(layout, toInt32(group, "group")); },
        nb::arg("layout"), nb::arg("group"),
        "Returns the page geometry of page group `group` of `layout` (compute_layout(config) or cache.layout()); "
        "raises OutOfRangeError for a group outside the layout's.");

    nb::class_<rt::SequenceFileInfo>(m, "SequenceFileInfo", "What a sequence file's header says.")
        .def_ro("version", &rt::SequenceFileInfo::version)
        .def_ro("geometry", &rt::SequenceFileInfo::geometry)
        .def_ro("page_count", &rt::SequenceFileInfo::pageCount)
        .def_ro("token_count", &rt::SequenceFileInfo::tokenCount);

    // Kept for the module's lifetime: nanobind may keep the docstrings' addresses.
    static std::string const offloadDoc =
        std::string("Copies each entry's device page, every layer of the group, K and V, to its host page.\n")
        + kTRANSFER_DOC;
    static std::string const onboardDoc =
        std::string("Copies each entry's host page to its device page, every layer of the group, K and V.\n")
        + kTRANSFER_DOC;
    nb::class_<TierHandle>(m, "HostTier", nb::is_weak_referenceable(),
        "Pinned host memory for pages of one page group of a cache, in host pages: a host page holds one page id's "
        "bytes of every layer of the group in layer order, K then V (a latent layer: its one half), then, for "
        "FP8_PER_TOKEN_HEAD and NVFP4, every layer's scale pages in the same order, host_page_bytes() in all. Offload "
        "(device pages to host pages) and onboard (host pages to device pages) move every layer of the group, data "
        "and scales, in one call, stream-ordered, without a host synchronisation. A host-list transfer touching a host "
        "page or page that a host-list transfer on another stream still moves waits for it on the "
        "device; device-list transfers are not tracked (order them yourself, and let them complete before the tier "
        "goes). The tier keeps its KVCacheManager alive. Calls hold the GIL, so Python threads use a tier one at a "
        "time; wait_until_ready releases it.")
        .def(
            "__init__",
            [](TierHandle* self, nb::handle cache, int64_t group, int64_t numHostPages, int64_t chunkBytes,
                bool preferGpuNumaNode, int64_t stagingBytes)
            {
                rt::HostTierOptions options;
                options.chunkBytes = chunkBytes;
                options.preferGpuNumaNode = preferGpuNumaNode;
                options.stagingBytes = stagingBytes;
                new (self) TierHandle(cache, group, numHostPages, options);
            },
            nb::arg("cache").none(), nb::arg("group"), nb::arg("num_host_pages"), nb::kw_only(),
            nb::arg("chunk_bytes") = rt::HostTierOptions{}.chunkBytes,
            nb::arg("prefer_gpu_numa_node") = rt::HostTierOptions{}.preferGpuNumaNode,
            nb::arg("staging_bytes") = rt::HostTierOptions{}.stagingBytes,
            "Sizes the tier for `num_host_pages` host pages of page group `group` of `cache` (a KVCacheManager, kept "
            "alive by the tier), pins the first chunk of `chunk_bytes` and starts a thread pinning the rest (on the "
            "GPU's NUMA node with prefer_gpu_numa_node); `staging_bytes` of device memory stage copy-engine "
            "transfers, half a direction. Raises TypeError when cache is no KVCacheManager, OutOfRangeError for a bad "
            "group, InvalidArgumentError for num_host_pages outside [1, 2**31 - 1], chunk_bytes <= 0 or "
            "staging_bytes < 0, OutOfMemoryError when memory cannot be had.")
        .def(
            "num_pinned_host_pages", [](TierHandle& t) { return t.tier().numPinnedHostPages(); },
            "Host pages pinned now: host pages [0, num_pinned_host_pages()) are usable. Grows to num_host_pages().")
        .def(
            "num_host_pages", [](TierHandle& t) { return t.tier().numHostPages(); },
            "Host pages the tier was sized for.")
        .def(
            "wait_until_ready",
            [](TierHandle& t)
            {
                nb::gil_scoped_release const released;
                t.tier().waitUntilReady();
            },
            "Blocks (without the GIL) until every host page is pinned; raises what stopped pinning (the tier keeps "
            "the host pages pinned so far).")
        .def(
            "host_page_bytes", [](TierHandle& t) { return t.tier().hostPageBytes(); },
            "Bytes of one host page: the group's bytes_per_page.")
        .def(
            "num_staging_host_pages", [](TierHandle& t) { return t.tier().numStagingHostPages(); },
            "Host pages the copy-engine path stages at a time in each direction.")
        .def(
            "group", [](TierHandle& t) { return t.tier().group(); }, "The page group the tier holds pages of.")
        .def(
            "device", [](TierHandle& t) { return t.tier().device(); }, "The device the tier's memory is mapped for.")
        .def(
            "numa_node", [](TierHandle& t) { return t.tier().numaNode(); },
            "The NUMA node the memory was bound to, or -1 when it was not.")
        .def(
            "geometry", [](TierHandle& t) { return t.tier().geometry(); },
            "The geometry a host page's bytes have (what sequence files record).")
        .def(
            "host_page_view",
            [](Self self, int64_t hostPage)
            {
                rt::HostTier& tier = self.p->tier();
                void* const data = tier.hostPageData(toInt32(hostPage, "host_page"));
                rt::Tensor const bytes(
                    data, rt::Coords{tier.hostPageBytes()}, rt::DataType::kUINT8, rt::DeviceType::kCPU);
                return DLPackView(bytes, kDLCPU, 0, nullptr, nb::borrow(self.h));
            },
            nb::arg("host_page"),
            "Host view (uint8 [host_page_bytes()], DLPack kDLCPU: numpy.from_dlpack, torch.from_dlpack) of host page "
            "`host_page`, after waiting on the host for the tier's transfers touching it; later transfers into it "
            "change what it shows. The view keeps the tier alive. Raises OutOfRangeError outside "
            "[0, num_pinned_host_pages()).")
        .def(
            "allocate_host_pages",
            [](TierHandle& t, int64_t count) { return t.tier().allocateHostPages(toInt32(count, "count")); },
            nb::arg("count"),
            "Hands out `count` free host pages among those pinned (released ones first, most recent first; then "
            "never used ones in ascending order), all or nothing: OutOfMemoryError naming the count, the free host "
            "pages and the pinned ones when they do not fit.")
        .def(
            "release_host_pages",
            [](TierHandle& t, nb::handle hostPages)
            {
                hostInt32s(hostPages, t.hostPages, "host_pages", "host pages");
                t.tier().releaseHostPages(
                    t.hostPages.data(), toInt32(static_cast<int64_t>(t.hostPages.size()), "len(host_pages)"));
            },
            nb::arg("host_pages").none(),
            "Returns host pages (a sequence of ints or a 1-D int array) to the free list, all or nothing: "
            "OutOfRangeError outside [0, num_pinned_host_pages()), InvalidArgumentError for one not handed out or "
            "listed twice.")
        .def(
            "num_free_host_pages", [](TierHandle& t) { return t.tier().numFreeHostPages(); },
            "Host pages neither handed out nor waiting to be pinned.")
        .def(
            "offload",
            [](TierHandle& t, nb::handle entries, nb::handle stream, rt::HostTierMethod method, nb::handle count,
                nb::handle errorCount) { return transfer(t, true, entries, stream, method, count, errorCount); },
            nb::arg("entries").none(), nb::arg("stream") = nb::none(), nb::kw_only(),
            nb::arg("method") = rt::HostTierMethod::kAUTO, nb::arg("count") = nb::none(),
            nb::arg("error_count") = nb::none(), offloadDoc.c_str())
        .def(
            "onboard",
            [](TierHandle& t, nb::handle entries, nb::handle stream, rt::HostTierMethod method, nb::handle count,
                nb::handle errorCount) { return transfer(t, false, entries, stream, method, count, errorCount); },
            nb::arg("entries").none(), nb::arg("stream") = nb::none(), nb::kw_only(),
            nb::arg("method") = rt::HostTierMethod::kAUTO, nb::arg("count") = nb::none(),
            nb::arg("error_count") = nb::none(), onboardDoc.c_str())
        .def(
            "is_host_page_busy",
            [](TierHandle& t, int64_t hostPage) { return t.tier().isHostPageBusy(toInt32(hostPage, "host_page")); },
            nb::arg("host_page"),
            "True while a host-list transfer touching `host_page` has not completed; OutOfRangeError outside "
            "[0, num_host_pages()).")
        .def(
            "synchronize_host_pages",
            [](TierHandle& t, nb::handle hostPages)
            {
                hostInt32s(hostPages, t.hostPages, "host_pages", "host pages");
                t.tier().synchronizeHostPages(t.hostPages.data(), static_cast<int64_t>(t.hostPages.size()));
            },
            nb::arg("host_pages").none(),
            "Waits on the host for the tier's transfers touching the listed host pages; raises OutOfRangeError "
            "outside [0, num_pinned_host_pages()), CudaError when a transfer failed.")
        .def(
            "last_event", [](TierHandle& t) { return reinterpret_cast<uintptr_t>(t.tier().lastEvent()); },
            "The cudaEvent_t handle (an int) recorded after the latest host-list transfer, 0 before the first; valid "
            "until the next transfer call.");

    m.def(
        "save_sequence",
        [](nb::handle path, nb::handle tier, nb::handle hostPages, int64_t tokenCount)
        {
            std::string const file = pathArgument(path);
            TierHandle& handle = tierArgument(tier);
            int64_t const count = hostPagesArgument(handle, hostPages);
            rt::saveSequence(file, handle.tier(), handle.manager(), handle.hostPages.data(), count, tokenCount);
        },
        nb::arg("path").none(), nb::arg("tier").none(), nb::arg("host_pages").none(), nb::arg("token_count"),
        "Writes host pages `host_pages` of `tier` (in that order) and `token_count` to a sequence file at `path` (str "
        "or os.PathLike), after waiting for the tier's transfers touching them: versioned, checksummed, written "
        "atomically (a temporary file renamed over `path`), with the cache's quantization and host-held layer scales. "
        "Raises InvalidArgumentError for a token count outside "
        "[0, len(host_pages) * tokens_per_page] (full attention), OutOfRangeError for a bad host page, RuntimeError "
        "when the file cannot be written (nothing is left behind).");
    m.def(
        "load_sequence",
        [](nb::handle path, nb::handle tier, nb::handle hostPages)
        {
            std::string const file = pathArgument(path);
            TierHandle& handle = tierArgument(tier);
            int64_t const count = hostPagesArgument(handle, hostPages);
            return rt::loadSequence(file, handle.tier(), handle.manager(), handle.hostPages.data(), count);
        },
        nb::arg("path").none(), nb::arg("tier").none(), nb::arg("host_pages").none(),
        "Reads the sequence file at `path` into host pages `host_pages` of `tier` and returns its token count. The "
        "whole file is verified before any host page is written: another geometry (quantization included), host-held "
        "layer scales other than the cache's, a count other than the file's page count, an old format version, a "
        "truncated or corrupt file, a host page listed twice raise InvalidArgumentError, a bad host "
        "page OutOfRangeError, and every host page keeps its bytes. RuntimeError when the file cannot be read.");
    m.def(
        "read_sequence_file_info", [](nb::handle path) { return rt::readSequenceFileInfo(pathArgument(path)); },
        nb::arg("path").none(),
        "Reads and checks the header of the sequence file at `path` (its page count sizes the host pages to load "
        "it into). Raises RuntimeError when it cannot be read, InvalidArgumentError naming the field for a file that "
        "is not a sequence file, of another version, corrupt or truncated.");
    m.def("write_sequence_file", &writeSequenceFile, nb::arg("path").none(), nb::arg("geometry"),
        nb::arg("token_count"), nb::arg("pages").none(),
        "Writes `pages` (a sequence of C-contiguous host arrays or bytes-like objects of geometry.bytes_per_page "
        "bytes each, e.g. the rows of a uint8 [n, bytes_per_page] array) and `token_count` to a sequence file at "
        "`path`, atomically, as save_sequence does for host pages of a tier.");
    m.def("read_sequence_file", &readSequenceFile, nb::arg("path").none(), nb::arg("expected"), nb::arg("pages").none(),
        "Reads the sequence file at `path` into `pages` (writable C-contiguous host arrays of "
        "expected.bytes_per_page bytes each, as many as the file's pages) and returns its token count; the whole "
        "file is verified first, so a bad file (or another geometry than `expected`) raises InvalidArgumentError "
        "and writes no page.");
}

} // namespace kvcache::python
