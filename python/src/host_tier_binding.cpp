// HostTier (pinned host pages of one page group: offload, onboard, host page views) and page geometries. The
// sequence files over a tier's host pages are in sequence_file_binding.cpp.

#include "bindings.h"
#include "cuda_arguments.h"
#include "dlpack_view.h"
#include "host_tier_handle.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/tiers/host_tier.h>

#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvcache::python
{

TierHandle::TierHandle(nb::handle cache, int64_t group, int64_t numHostPages, rt::HostTierOptions const& options)
    : mCacheObject(nb::borrow(cache))
    , mCache(cacheAccess(cache))
    , mOwnedTier(std::make_unique<rt::HostTier>(*mCache.manager, toInt32(group, "group"), numHostPages, options))
    , mTier(mOwnedTier.get())
{
}

TierHandle::TierHandle(nb::handle owner, nb::handle cache, rt::HostTier& tier)
    : mCacheObject(nb::borrow(cache))
    , mCache(cacheAccess(cache))
    , mOwner(nb::borrow(owner))
    , mTier(&tier)
{
}

void TierHandle::refuseIfLent(char const* what) const
{
    if (isLent())
    {
        throw rt::InvalidArgumentError(fmt::format("{}: the tier belongs to a TieredPrefixCache, which holds its host "
                                                   "pages; read them (host_page_view, onboard, save_sequence), never "
                                                   "write, hand out or release them",
            what));
    }
}

std::string hostTierOptionParameters()
{
    rt::HostTierOptions const defaults;
    return fmt::format("chunk_bytes: int = {}, prefer_gpu_numa_node: bool = {}, staging_bytes: int = {}",
        defaults.chunkBytes, defaults.preferGpuNumaNode ? "True" : "False", defaults.stagingBytes);
}

TierHandle& tierArgument(nb::handle tier)
{
    return *checkedCast<TierHandle*>(tier, "tier", "a HostTier");
}

namespace
{

using Self = nb::pointer_and_handle<TierHandle>;

constexpr PairListName kENTRIES{"entries", "ids", "(page, host_page)"};
constexpr PairListName kSTATE_ENTRIES{"entries", "ids", "(slot, host_state)"};

//! Offloads (toHost) or onboards host states: a host list of (slot, host_state) pairs, checked by the C++ call.
void transferStates(TierHandle& handle, bool toHost, nb::handle entries, nb::handle stream)
{
    if (toHost)
    {
        handle.refuseIfLent("HostTier.offload_states");
    }
    cudaStream_t const onStream = streamArgument(stream, handle.cacheStream());
    hostInt32Pairs(entries, handle.stateEntries, kSTATE_ENTRIES);
    if (toHost)
    {
        handle.tier().offloadStates(handle.manager(), handle.stateEntries, onStream);
    }
    else
    {
        handle.tier().onboardStates(handle.manager(), handle.stateEntries, onStream);
    }
}

char const* const kSTATE_TRANSFER_DOC =
    "entries: (slot, host_state) pairs (a sequence of pairs or an [n, 2] int array), slot a state slot of the\n"
    "tier's cache, host_state one of the tier's. Every state layer and tensor of the slot moves, stream-ordered on\n"
    "`stream` (default: the cache's), without a host synchronisation; a transfer touching a host state or slot that\n"
    "one on another stream still moves waits for it on the device. Raises, before enqueuing anything:\n"
    "OutOfRangeError for a slot outside [0, num_state_slots) or a host state outside [0, num_host_states()),\n"
    "InvalidArgumentError for a cache without state layers, a slot or a host state listed twice or a capturing\n"
    "stream.";

//! Offloads (toHost) or onboards the entries: a host list through the checked C++ call, or a device int32 array
//! ([n, 2] or [2n]) through the device-list call, with the kernel. Returns the method used.
rt::HostTierMethod transfer(TierHandle& handle, bool toHost, nb::handle entries, nb::handle stream,
    rt::HostTierMethod method, nb::handle count, nb::handle errorCount)
{
    if (toHost)
    {
        handle.refuseIfLent("HostTier.offload");
    }
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

// offload and onboard have their signatures written out: `entries` takes None only for the sake of its TypeError
// message, and its type (a stub alias) does not include None.
char const* const kTRANSFER_PARAMETERS =
    "(self, entries: HostTierEntries, stream: StreamLike | None = None, *, method: HostTierMethod = "
    "kvcache._kvcache.HostTierMethod.AUTO, count: DeviceArray | None = None, error_count: DeviceArray | None = None) "
    "-> HostTierMethod";

} // namespace

void bindHostTier(nb::module_& m)
{
    m.attr("HOST_TIER_KERNEL_MAX_BYTES") = rt::kHOST_TIER_KERNEL_MAX_BYTES;
    m.attr("HOST_TIER_MAX_SMS") = rt::kHOST_TIER_MAX_SMS;
    m.attr("HOST_TIER_MAX_CHUNKS") = rt::kHOST_TIER_MAX_CHUNKS;

    nb::enum_<rt::HostTierMethod>(m, "HostTierMethod", "How a host tier transfer moves its bytes.")
        .value("AUTO", rt::HostTierMethod::kAUTO,
            "The kernel for at most HOST_TIER_KERNEL_MAX_BYTES (count * host_page_bytes), the copy engine above.")
        .value("COPY_ENGINE", rt::HostTierMethod::kCOPY_ENGINE,
            "The copy engine: fewer than 16 host pages straight, one descriptor a page half; more staged through the "
            "tier's device staging buffer, one descriptor a host page.")
        .value("KERNEL", rt::HostTierMethod::kKERNEL,
            "A kernel on at most HOST_TIER_MAX_SMS multiprocessors over the mapped pinned memory (device lists too).");

    nb::class_<rt::PageLayerGeometry>(m, "PageLayerGeometry", "One layer of a page group as its pages hold it.")
        .def_ro("kind", &rt::PageLayerGeometry::kind)
        .def_ro("num_kv_heads", &rt::PageLayerGeometry::numKVHeads)
        .def_ro("head_dim", &rt::PageLayerGeometry::headDim)
        .def(
            "__eq__", [](rt::PageLayerGeometry const& a, rt::PageLayerGeometry const& b) { return a == b; },
            nb::is_operator(), nb::sig(kEQ_SIGNATURE))
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
            "__eq__", [](rt::PageGeometry const& a, rt::PageGeometry const& b) { return a == b; }, nb::is_operator(),
            nb::sig(kEQ_SIGNATURE))
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

    // Kept for the module's lifetime: nanobind may keep the docstrings' addresses.
    static std::string const offloadDoc =
        std::string("Copies each entry's device page, every layer of the group, K and V, to its host page.\n")
        + kTRANSFER_DOC;
    static std::string const onboardDoc =
        std::string("Copies each entry's host page to its device page, every layer of the group, K and V.\n")
        + kTRANSFER_DOC;
    static std::string const offloadStatesDoc =
        std::string("Copies each entry's state slot, every state layer and tensor, to its host state.\n")
        + kSTATE_TRANSFER_DOC;
    static std::string const onboardStatesDoc =
        std::string("Copies each entry's host state to its state slot, every state layer and tensor.\n")
        + kSTATE_TRANSFER_DOC;
    nb::class_<TierHandle>(m, "HostTier", nb::is_weak_referenceable(),
        "Pinned host memory for pages of one page group of a cache, in host pages: a host page holds one page id's "
        "bytes of every layer of the group in layer order, K then V (a latent layer: its one half), then, for "
        "FP8_PER_TOKEN_HEAD and NVFP4, every layer's scale pages in the same order, host_page_bytes() in all. Offload "
        "(device pages to host pages) and onboard (host pages to device pages) move every layer of the group, data "
        "and scales, in one call, stream-ordered, without a host synchronisation. A host-list transfer touching a host "
        "page or page that a host-list transfer on another stream still moves waits for it on the "
        "device; device-list transfers are not tracked (order them yourself, and let them complete before the tier "
        "goes). The tier keeps its KVCacheManager alive. Calls hold the GIL, so Python threads use a tier one at a "
        "time; wait_until_ready releases it. TieredPrefixCache.host_tier(g) lends the tier of a tiered cache, which "
        "it keeps alive: its host pages belong to the tiered cache, so offload, allocate_host_pages, "
        "release_host_pages and load_sequence refuse it (InvalidArgumentError).")
        .def(
            "__init__",
            [](TierHandle* self, nb::handle cache, int64_t group, int64_t numHostPages, int64_t chunkBytes,
                bool preferGpuNumaNode, int64_t stagingBytes, int64_t numHostStates)
            {
                rt::HostTierOptions options;
                options.chunkBytes = chunkBytes;
                options.preferGpuNumaNode = preferGpuNumaNode;
                options.stagingBytes = stagingBytes;
                options.numHostStates = numHostStates;
                new (self) TierHandle(cache, group, numHostPages, options);
            },
            nb::arg("cache").none(), nb::arg("group"), nb::arg("num_host_pages"), nb::kw_only(),
            nb::arg("chunk_bytes") = rt::HostTierOptions{}.chunkBytes,
            nb::arg("prefer_gpu_numa_node") = rt::HostTierOptions{}.preferGpuNumaNode,
            nb::arg("staging_bytes") = rt::HostTierOptions{}.stagingBytes,
            nb::arg("num_host_states") = rt::HostTierOptions{}.numHostStates,
            nb::sig(fmt::format("def __init__(self, cache: KVCacheManager, group: int, num_host_pages: int, *, {}, "
                                "num_host_states: int = {}) -> None",
                hostTierOptionParameters(), rt::HostTierOptions{}.numHostStates)
                        .c_str()),
            "Sizes the tier for `num_host_pages` host pages of page group `group` of `cache` (a KVCacheManager, kept "
            "alive by the tier), pins the first chunk of `chunk_bytes` and starts a thread pinning the rest (on the "
            "GPU's NUMA node with prefer_gpu_numa_node); `staging_bytes` of device memory stage copy-engine "
            "transfers, half a direction; `num_host_states` host states (host_state_bytes() each) hold state slots. "
            "Raises TypeError when cache is no KVCacheManager, OutOfRangeError for a bad group, InvalidArgumentError "
            "for num_host_pages outside [1, 2**31 - 1], chunk_bytes <= 0, staging_bytes < 0, or num_host_states "
            "outside [0, 2**31 - 1] or above 0 for a cache without state layers, OutOfMemoryError when memory cannot "
            "be had.")
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
            [](TierHandle& t, int64_t count)
            {
                t.refuseIfLent("HostTier.allocate_host_pages");
                return t.tier().allocateHostPages(toInt32(count, "count"));
            },
            nb::arg("count"),
            "Hands out `count` free host pages among those pinned (released ones first, most recent first; then "
            "never used ones in ascending order), all or nothing: OutOfMemoryError naming the count, the free host "
            "pages and the pinned ones when they do not fit.")
        .def(
            "release_host_pages",
            [](TierHandle& t, nb::handle hostPages)
            {
                t.refuseIfLent("HostTier.release_host_pages");
                hostInt32s(hostPages, t.hostPages, "host_pages", "host pages");
                t.tier().releaseHostPages(
                    t.hostPages.data(), toInt32(static_cast<int64_t>(t.hostPages.size()), "len(host_pages)"));
            },
            nb::arg("host_pages").none(), nb::sig("def release_host_pages(self, host_pages: HostIds) -> None"),
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
            nb::arg("error_count") = nb::none(), nb::sig((std::string("def offload") + kTRANSFER_PARAMETERS).c_str()),
            offloadDoc.c_str())
        .def(
            "onboard",
            [](TierHandle& t, nb::handle entries, nb::handle stream, rt::HostTierMethod method, nb::handle count,
                nb::handle errorCount) { return transfer(t, false, entries, stream, method, count, errorCount); },
            nb::arg("entries").none(), nb::arg("stream") = nb::none(), nb::kw_only(),
            nb::arg("method") = rt::HostTierMethod::kAUTO, nb::arg("count") = nb::none(),
            nb::arg("error_count") = nb::none(), nb::sig((std::string("def onboard") + kTRANSFER_PARAMETERS).c_str()),
            onboardDoc.c_str())
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
            nb::arg("host_pages").none(), nb::sig("def synchronize_host_pages(self, host_pages: HostIds) -> None"),
            "Waits on the host for the tier's transfers touching the listed host pages; raises OutOfRangeError "
            "outside [0, num_pinned_host_pages()), CudaError when a transfer failed.")
        .def(
            "last_event", [](TierHandle& t) { return reinterpret_cast<uintptr_t>(t.tier().lastEvent()); },
            "The cudaEvent_t handle (an int) recorded after the latest host-list transfer (pages or states), 0 before "
            "the first; valid until the next transfer call.")
        .def(
            "num_host_states", [](TierHandle& t) { return t.tier().numHostStates(); },
            "Host states the tier holds (num_host_states at construction), all pinned.")
        .def(
            "host_state_bytes", [](TierHandle& t) { return t.tier().hostStateBytes(); },
            "Bytes of one host state: the cache layout's state_bytes_per_slot (0 without state layers).")
        .def(
            "host_state_view",
            [](Self self, int64_t hostState)
            {
                rt::HostTier& tier = self.p->tier();
                void* const data = tier.hostStateData(toInt32(hostState, "host_state"));
                rt::Tensor const bytes(
                    data, rt::Coords{tier.hostStateBytes()}, rt::DataType::kUINT8, rt::DeviceType::kCPU);
                return DLPackView(bytes, kDLCPU, 0, nullptr, nb::borrow(self.h));
            },
            nb::arg("host_state"),
            "Host view (uint8 [host_state_bytes()], DLPack kDLCPU) of host state `host_state`: every state layer's "
            "slot in layout order, each layer's tensors in config order, back to back; after waiting on the host for "
            "the tier's transfers touching it. The view keeps the tier alive. Raises OutOfRangeError outside "
            "[0, num_host_states()).")
        .def(
            "allocate_host_states",
            [](TierHandle& t, int64_t count)
            {
                t.refuseIfLent("HostTier.allocate_host_states");
                return t.tier().allocateHostStates(toInt32(count, "count"));
            },
            nb::arg("count"),
            "Hands out `count` free host states, all or nothing: OutOfMemoryError naming the count and the free host "
            "states when they do not fit.")
        .def(
            "release_host_states",
            [](TierHandle& t, nb::handle hostStates)
            {
                t.refuseIfLent("HostTier.release_host_states");
                hostInt32s(hostStates, t.hostPages, "host_states", "host states");
                t.tier().releaseHostStates(
                    t.hostPages.data(), toInt32(static_cast<int64_t>(t.hostPages.size()), "len(host_states)"));
            },
            nb::arg("host_states").none(), nb::sig("def release_host_states(self, host_states: HostIds) -> None"),
            "Returns host states to the free list, all or nothing: OutOfRangeError outside [0, num_host_states()), "
            "InvalidArgumentError for one not handed out or listed twice.")
        .def(
            "num_free_host_states", [](TierHandle& t) { return t.tier().numFreeHostStates(); },
            "Host states not handed out.")
        .def(
            "offload_states",
            [](TierHandle& t, nb::handle entries, nb::handle stream) { transferStates(t, true, entries, stream); },
            nb::arg("entries").none(), nb::arg("stream") = nb::none(),
            nb::sig("def offload_states(self, entries: HostStateEntries, stream: StreamLike | None = None) -> None"),
            offloadStatesDoc.c_str())
        .def(
            "onboard_states",
            [](TierHandle& t, nb::handle entries, nb::handle stream) { transferStates(t, false, entries, stream); },
            nb::arg("entries").none(), nb::arg("stream") = nb::none(),
            nb::sig("def onboard_states(self, entries: HostStateEntries, stream: StreamLike | None = None) -> None"),
            onboardStatesDoc.c_str())
        .def(
            "is_host_state_busy",
            [](TierHandle& t, int64_t hostState) { return t.tier().isHostStateBusy(toInt32(hostState, "host_state")); },
            nb::arg("host_state"),
            "True while a transfer touching `host_state` has not completed; OutOfRangeError outside "
            "[0, num_host_states()).")
        .def(
            "synchronize_host_states",
            [](TierHandle& t, nb::handle hostStates)
            {
                hostInt32s(hostStates, t.hostPages, "host_states", "host states");
                t.tier().synchronizeHostStates(t.hostPages.data(), static_cast<int64_t>(t.hostPages.size()));
            },
            nb::arg("host_states").none(), nb::sig("def synchronize_host_states(self, host_states: HostIds) -> None"),
            "Waits on the host for the tier's transfers touching the listed host states; raises OutOfRangeError "
            "outside [0, num_host_states()), CudaError when a transfer failed.");
}

} // namespace kvcache::python
