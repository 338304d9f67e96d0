#include "bindings.h"
#include "cuda_arguments.h"
#include "dlpack_view.h"
#include "handle_stream.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/dist/tensor_parallel.h>
#include <kvcache/dist/transfer_descriptors.h>
#include <kvcache/memory/kv_cache_manager.h>
#include <kvcache/memory/page_ops.h>

#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace kvcache::python
{
namespace
{

//! A KVCacheManager with the stream it lives on (created here unless the caller gave one) and the event that orders
//! consumers of its views after its work. The manager goes first, then the event, then a stream created here.
class CacheHandle
{
public:
    //! Takes a config that computeLayout accepted, so that a bad one is reported as such even where there is no GPU.
    CacheHandle(rt::KVCacheConfig const& config, nb::handle stream)
        : mStream(stream)
        , mManager(std::make_unique<rt::KVCacheManager>(config, mStream.stream()))
    {
        mStream.createEvent(mManager->device());
    }

    rt::KVCacheManager& manager() noexcept
    {
        return *mManager;
    }
    StreamOrder const& order() const noexcept
    {
        return mStream.order();
    }
    cudaStream_t stream() const noexcept
    {
        return mStream.stream();
    }

    //! Returns `layer` as int32 when it indexes a layer; throws OutOfRangeError naming the index and the count.
    int32_t layer(int64_t layer) const
    {
        if (layer < 0 || layer >= mManager->numLayers())
        {
            throw rt::OutOfRangeError(
                fmt::format("layer index is {}; it must be in [0, {}) (num_layers)", layer, mManager->numLayers()));
        }
        return static_cast<int32_t>(layer);
    }
    //! Returns `layer` as int32 for a manager call that checks the index itself, so that the message is the C++
    //! call's; an index beyond int32 is out of range all the same (OutOfRangeError, as from layer()).
    int32_t layerForManager(int64_t layer) const
    {
        if (layer < std::numeric_limits<int32_t>::min() || layer > std::numeric_limits<int32_t>::max())
        {
            return this->layer(layer);
        }
        return static_cast<int32_t>(layer);
    }
    //! Returns `group` as int32 when it indexes a page group; throws OutOfRangeError otherwise.
    int32_t group(int64_t group) const
    {
        if (group < 0 || group >= mManager->numGroups())
        {
            throw rt::OutOfRangeError(
                fmt::format("group index is {}; it must be in [0, {}) (num_groups)", group, mManager->numGroups()));
        }
        return static_cast<int32_t>(group);
    }

    //! Returns `layer` as int32 when it indexes a state layer; throws OutOfRangeError naming the index and the count.
    int32_t stateLayer(int64_t layer) const
    {
        if (layer < 0 || layer >= mManager->numStateLayers())
        {
            throw rt::OutOfRangeError(fmt::format("state layer index is {}; it must be in [0, {}) (num_state_layers)",
                layer, mManager->numStateLayers()));
        }
        return static_cast<int32_t>(layer);
    }

    //! Host lists are read into these, reused between calls so that a call allocates nothing in steady state.
    std::vector<rt::PageCopy> pairs;
    std::vector<int32_t> pages;
    std::vector<rt::StateSlotCopy> states;

private:
    HandleStream mStream;
    std::unique_ptr<rt::KVCacheManager> mManager;
};

using Self = nb::pointer_and_handle<CacheHandle>;

//! Adds nothing: ends the list of managerAccessors.
void managerAccessors(nb::class_<CacheHandle>&)
{
}

//! Adds a method to `cls` for each (Python name, KVCacheManager accessor) pair: the accessor's value, copied.
template <typename Accessor, typename... Rest>
void managerAccessors(nb::class_<CacheHandle>& cls, char const* name, Accessor accessor, Rest... rest)
{
    cls.def(name, [accessor](CacheHandle& c) { return (c.manager().*accessor)(); });
    managerAccessors(cls, rest...);
}

DLPackView viewOf(Self self, rt::Tensor const& tensor)
{
    return DLPackView(tensor, kDLCUDA, self.p->manager().device(), &self.p->order(), nb::borrow(self.h));
}

//! Returns the K or V pool of `layer` as a view [num_pages, tokens_per_page, H, D]; throws InvalidArgumentError for
//! the V pool of a latent layer.
DLPackView poolHalfView(Self self, int64_t layer, rt::KVHalf half)
{
    rt::KVCacheManager& manager = self.p->manager();
    int32_t const index = self.p->layer(layer);
    rt::KVLayerLayout const& sizes = manager.layout().layers[static_cast<size_t>(index)];
    if (half == rt::KVHalf::kV && sizes.kind == rt::KVLayerKind::kLATENT)
    {
        throw rt::InvalidArgumentError(
            fmt::format("layer {} is a latent (KVLayerKind.LATENT) layer: it caches K only and has no V pool", index));
    }
    rt::Tensor const pool(half == rt::KVHalf::kK ? manager.kPoolPtr(index) : manager.vPoolPtr(index),
        rt::Coords{sizes.numPages, manager.tokensPerPage(), sizes.numKVHeads, sizes.headDim}, manager.layout().dataType,
        rt::DeviceType::kGPU);
    return viewOf(self, pool);
}

//! Returns tensor `tensor` (its index, or its name) of state layer `layer` as a view [num_state_slots, ...shape] in
//! the tensor's dtype. Throws OutOfRangeError for a bad layer or tensor index, InvalidArgumentError (naming the
//! layer's tensors) for an unknown name and TypeError for a tensor that is neither an int nor a str.
DLPackView stateTensorView(Self self, int64_t layer, nb::handle tensor)
{
    rt::KVCacheManager const& manager = self.p->manager();
    int32_t const index = self.p->stateLayer(layer);
    if (nb::isinstance<nb::str>(tensor))
    {
        return viewOf(self, manager.stateView(index, std::string_view(nb::borrow<nb::str>(tensor).c_str())));
    }
    if (nb::isinstance<nb::bool_>(tensor) || PyIndex_Check(tensor.ptr()) == 0)
    {
        throwTypeError(tensor, "tensor", "an int (the tensor's index in its layer) or a str (its name)");
    }
    int64_t const tensorIdx = intArgument(tensor, "tensor");
    auto const numTensors =
        static_cast<int64_t>(manager.layout().stateLayers[static_cast<size_t>(index)].tensors.size());
    if (tensorIdx < 0 || tensorIdx >= numTensors)
    {
        throw rt::OutOfRangeError(
            fmt::format("tensor index is {}; state layer {} has {} tensors, so it must be in [0, {})", tensorIdx, index,
                numTensors, numTensors));
    }
    return viewOf(self, manager.stateView(index, static_cast<int32_t>(tensorIdx)));
}

rt::PageOpTarget targetOf(nb::handle target, nb::handle group)
{
    rt::PageOpTarget result;
    if (!target.is_none())
    {
        result = checkedCast<rt::PageOpTarget>(target, "target", "a PageOpTarget or None");
    }
    if (!group.is_none())
    {
        result.group = toInt32(intArgument(group, "group"), "group");
    }
    return result;
}

//! What both page operations take besides their list: the stream (default: the cache's), the target and the device.
struct PageOpCall
{
    cudaStream_t stream = nullptr;
    rt::PageOpTarget target = {};
    int32_t device = 0;
};

PageOpCall pageOpCall(CacheHandle& cache, nb::handle stream, nb::handle target, nb::handle group)
{
    return PageOpCall{streamArgument(stream, cache.stream()), targetOf(target, group), cache.manager().device()};
}

void copyPages(CacheHandle& cache, PagePairsArgument const& pairs, StreamArgument const& stream,
    PageOpTargetArgument const& target, IntArgument const& group, DeviceArrayArgument const& count,
    DeviceArrayArgument const& errorCount)
{
    PageOpCall const call = pageOpCall(cache, stream, target, group);
    if (std::optional<DeviceInt32Array> const list = deviceInt32Array(pairs, call.stream, call.device, "pairs"))
    {
        if (list->count % 2 != 0)
        {
            throw rt::InvalidArgumentError(
                fmt::format("pairs has {} int32 entries; a device list of pairs has an even number", list->count));
        }
        int32_t const capacity = toInt32(list->count / 2, "pairs capacity");
        rt::copyPagesDevice(cache.manager(), reinterpret_cast<rt::PageCopy const*>(list->data), capacity,
            deviceScalar(count, call.stream, call.device, "count"), call.stream, call.target,
            deviceScalar(errorCount, call.stream, call.device, "error_count"));
        return;
    }
    requireHostListArguments(count, errorCount, "pairs");
    hostPagePairs(pairs, cache.pairs);
    rt::copyPages(cache.manager(), cache.pairs, call.stream, call.target);
}

void resetPages(CacheHandle& cache, PageIdsArgument const& pages, StreamArgument const& stream, int64_t pattern,
    PageOpTargetArgument const& target, IntArgument const& group, DeviceArrayArgument const& count,
    DeviceArrayArgument const& errorCount)
{
    if (pattern < 0 || pattern > static_cast<int64_t>(UINT32_MAX))
    {
        throw rt::InvalidArgumentError(fmt::format("pattern is {}; it must be in [0, {}]", pattern, UINT32_MAX));
    }
    uint32_t const fill = static_cast<uint32_t>(pattern);
    PageOpCall const call = pageOpCall(cache, stream, target, group);
    if (std::optional<DeviceInt32Array> const list = deviceInt32Array(pages, call.stream, call.device, "pages"))
    {
        rt::resetPagesDevice(cache.manager(), list->data, toInt32(list->count, "pages capacity"),
            deviceScalar(count, call.stream, call.device, "count"), call.stream, fill, call.target,
            deviceScalar(errorCount, call.stream, call.device, "error_count"));
        return;
    }
    requireHostListArguments(count, errorCount, "pages");
    hostPageIds(pages, cache.pages);
    rt::resetPages(cache.manager(), cache.pages, call.stream, fill, call.target);
}

void copyStates(CacheHandle& cache, StatePairsArgument const& pairs, StreamArgument const& stream)
{
    cudaStream_t const onStream = streamArgument(stream, cache.stream());
    char const* const expected = "a sequence of (src, dst) state slot pairs or an [n, 2] int array on the host";
    if (deviceInt32Array(pairs, onStream, cache.manager().device(), "pairs").has_value())
    {
        throw rt::InvalidArgumentError(
            fmt::format("copy_states: pairs is a device array; it takes {} (the list travels as kernel parameters, "
                        "so a captured graph replays the pairs it was captured with)",
                expected));
    }
    requireIterable(pairs, "pairs", expected);
    hostInt32Pairs(pairs, cache.states, PairListName{"pairs", "state slots", "(src, dst)"});
    rt::copyStates(cache.manager(), cache.states, onStream);
}

char const* const kCOPY_STATES_DOC =
    "Copies each (src, dst) state slot in every state layer and tensor, all in one launch (per\n"
    "MAX_INLINE_STATE_COPIES pairs), stream-ordered (default: the cache's stream): a fork's state copies\n"
    "(PageManager.last_state_copies()) before the step's kernels. pairs: a host list (sequence of pairs, [n, 2]\n"
    "int array), checked before anything is launched: OutOfRangeError for a slot outside [0, num_state_slots),\n"
    "InvalidArgumentError for a destination listed twice, a slot both source and destination, a cache without state\n"
    "layers or a device array. stream: int handle or object with __cuda_stream__ / cuda_stream.";

char const* const kCOPY_PAGES_DOC =
    "Copies each (src, dst) page in every targeted layer and half, stream-ordered (default: the cache's stream).\n"
    "pairs: a host list (sequence of pairs, [n, 2] int array) validated before launch, or a device int32 array\n"
    "([n, 2] or [2n], __dlpack__ or __cuda_array_interface__) read by the kernel, so a CUDA graph that captured\n"
    "the call replays with its current contents; count / error_count: optional one-element device int32 arrays\n"
    "(device lists only). stream: int handle or object with __cuda_stream__ / cuda_stream.";
char const* const kRESET_PAGES_DOC =
    "Fills each listed page with the 4-byte little-endian pattern (0 clears) in every targeted layer and half;\n"
    "pages as for copy_pages (host list or device int32 array).";

char const* const kSTATE_VIEW_DOC =
    "Tensor `tensor` (its index in the layer, or its name) of state layer `layer`, zero-copy: [num_state_slots,\n"
    "*shape], contiguous, in the tensor's dtype. Row n is state slot n (PageManager.state_slot): one sequence's\n"
    "state, or a checkpoint's. State memory starts uninitialized. Raises OutOfRangeError for a bad layer or tensor\n"
    "index, InvalidArgumentError naming the layer's tensors for an unknown name.";

char const* const kSCALE_POOL_VIEW_DOC =
    "Scale pool view of a layer, zero-copy, K scales then V scales (view[0], view[1]), as FlashInfer's kv_cache_sf:\n"
    "[num_halves, num_pages, tokens_per_page, H] float32 (FP8_PER_TOKEN_HEAD: a scale a page, token and head) or\n"
    "[num_halves, num_pages, tokens_per_page, H, head_dim / 16] FP8 E4M3 (NVFP4: a block scale a 16 values);\n"
    "num_halves is 1 for a latent layer. Raises OutOfRangeError for a bad index and InvalidArgumentError, naming\n"
    "the quantization, for a cache without scale pools.";
char const* const kLAYER_SCALES_DOC =
    "A copy of the layer's host-held scales: FP8_PER_TENSOR's K and V decode scales or NVFP4's global scales, 1.0\n"
    "until set (a latent layer's v is unused). Raises OutOfRangeError for a bad index and InvalidArgumentError,\n"
    "naming the quantization, unless it is FP8_PER_TENSOR or NVFP4.";
char const* const kSET_LAYER_SCALES_DOC =
    "Sets the layer's host-held scales (FP8_PER_TENSOR: finite, >= 0; NVFP4: finite, > 0), which later writes\n"
    "quantize with and sequence files record. Raises as layer_scales does, and InvalidArgumentError naming the\n"
    "scale, its value and the limit; a refused call changes nothing.";

} // namespace

void bindManager(nb::module_& m)
{
    nb::enum_<rt::KVHalf>(m, "KVHalf", "Which half of each layer a page operation touches.")
        .value("BOTH", rt::KVHalf::kBOTH)
        .value("K", rt::KVHalf::kK)
        .value("V", rt::KVHalf::kV);

    nb::class_<rt::PageOpTarget>(m, "PageOpTarget", "The page group, layers and halves a page operation touches.")
        .def(
            "__init__",
            [](rt::PageOpTarget* self, int64_t firstLayer, int64_t numLayers, rt::KVHalf half, int64_t group)
            {
                new (self) rt::PageOpTarget{toInt32(firstLayer, "PageOpTarget.first_layer"),
                    toInt32(numLayers, "PageOpTarget.num_layers"), half, toInt32(group, "PageOpTarget.group")};
            },
            nb::kw_only(), nb::arg("first_layer") = 0, nb::arg("num_layers") = -1, nb::arg("half") = rt::KVHalf::kBOTH,
            nb::arg("group") = -1)
        .def_rw("first_layer", &rt::PageOpTarget::firstLayer, "First layer, a position in the group's layer list.")
        .def_rw("num_layers", &rt::PageOpTarget::numLayers, "Layers from first_layer on; -1 means all.")
        .def_rw("half", &rt::PageOpTarget::half, "BOTH, K or V.")
        .def_rw("group", &rt::PageOpTarget::group, "Page group; -1 means the only one.");

    nb::class_<rt::LayerRef> layerRef(
        m, "LayerRef", "One layer's pools as a kernel addresses them (addresses as ints).");
    layerRef.def_prop_ro("k_pool", [](rt::LayerRef const& ref) { return reinterpret_cast<uintptr_t>(ref.kPool); })
        .def_prop_ro("v_pool", [](rt::LayerRef const& ref) { return reinterpret_cast<uintptr_t>(ref.vPool); });
    readOnlyFields(layerRef, "page_stride", &rt::LayerRef::pageStride, "token_stride", &rt::LayerRef::tokenStride,
        "head_stride", &rt::LayerRef::headStride, "element_bytes", &rt::LayerRef::elementBytes, "num_pages",
        &rt::LayerRef::numPages, "tokens_per_page", &rt::LayerRef::tokensPerPage, "num_kv_heads",
        &rt::LayerRef::numKVHeads, "head_dim", &rt::LayerRef::headDim);

    nb::class_<CacheHandle> cls(m, "KVCacheManager", nb::is_weak_referenceable(),
        "Owns one device buffer per attention layer (cudaMallocAsync on its stream) and hands out zero-copy DLPack "
        "views of it. Views and the tensors made from them keep the manager alive.");
    cls.def(
           "__init__",
           [](CacheHandle* self, rt::KVCacheConfig const& config, StreamArgument const& stream)
           {
               rt::computeLayout(config);
               new (self) CacheHandle(config, stream);
           },
           nb::arg("config"), nb::arg("stream") = nb::none(),
           "Validates `config` (InvalidConfigError) and allocates the cache on `stream` (int handle or object with "
           "__cuda_stream__ / cuda_stream, kept referenced; None creates a non-blocking stream the manager owns) on "
           "the current device. Raises OutOfMemoryError when the memory cannot be had.")
        .def(
            "pool_view",
            [](Self self, int64_t layer) { return viewOf(self, self.p->manager().poolView(self.p->layer(layer))); },
            nb::arg("layer"), "Pool view [2, num_pages, tokens_per_page, H, D] ([1, ...] for a latent layer).")
        .def(
            "slot_view",
            [](Self self, int64_t layer) { return viewOf(self, self.p->manager().slotView(self.p->layer(layer))); },
            nb::arg("layer"),
            "Slot view [2, max_batch_size, slot_tokens, H, D]; raises InvalidConfigError when the layer's group has "
            "retained pages.")
        .def(
            "k_pool", [](Self self, int64_t layer) { return poolHalfView(self, layer, rt::KVHalf::kK); },
            nb::arg("layer"), "K pool [num_pages, tokens_per_page, H, D] of a layer.")
        .def(
            "v_pool", [](Self self, int64_t layer) { return poolHalfView(self, layer, rt::KVHalf::kV); },
            nb::arg("layer"),
            "V pool [num_pages, tokens_per_page, H, D]; raises InvalidArgumentError for a latent "
            "layer.")
        .def(
            "separate_view",
            [](Self self, int64_t layer)
            {
                std::pair<rt::Tensor, rt::Tensor> const halves = self.p->manager().separateView(self.p->layer(layer));
                return std::make_pair(viewOf(self, halves.first), viewOf(self, halves.second));
            },
            nb::arg("layer"), "K and V views, each [max_batch_size, slot_tokens, H, D] (V empty for a latent layer).")
        .def(
            "state_view",
            [](Self self, int64_t layer, StateTensorArgument const& tensor)
            { return stateTensorView(self, layer, tensor); },
            nb::arg("layer"), nb::arg("tensor"), kSTATE_VIEW_DOC)
        .def(
            "transfer_description",
            [](CacheHandle& c, std::optional<rt::KVCacheConfig> const& modelConfig, int32_t tp, int32_t rank)
            {
                std::optional<rt::TensorParallelShard> shard;
                if (modelConfig.has_value())
                {
                    shard = rt::tensorParallelShard(*modelConfig, tp, rank);
                }
                else if (tp != 1 || rank != 0)
                {
                    throw rt::InvalidArgumentError(fmt::format(
                        "KVCacheManager.transfer_description: tp is {} and rank {}; with tensor parallelism give "
                        "model_config, the whole model's config, so that the heads this rank holds are known",
                        tp, rank));
                }
                std::vector<uint8_t> const bytes = rt::encodeTransferDescription(
                    rt::describeForTransfer(c.manager(), shard.has_value() ? &*shard : nullptr));
                return nb::bytes(reinterpret_cast<char const*>(bytes.data()), bytes.size());
            },
            nb::arg("model_config") = nb::none(), nb::arg("tp") = 1, nb::arg("rank") = 0,
            "This cache's transfer description as bytes, to send to the other side of a page transfer: its device, "
            "pools, geometry and host-held scales, and for rank `rank` of `tp` (model_config: the whole model's "
            "Config) the heads it holds (docs/transfer_descriptors.md).")
        .def(
            "scale_pool_view",
            [](Self self, int64_t layer)
            { return viewOf(self, self.p->manager().scalePoolView(self.p->layerForManager(layer))); },
            nb::arg("layer"), kSCALE_POOL_VIEW_DOC)
        .def(
            "layer_scales",
            [](CacheHandle& c, int64_t layer) { return c.manager().layerScales(c.layerForManager(layer)); },
            nb::arg("layer"), kLAYER_SCALES_DOC)
        .def(
            "set_layer_scales",
            [](CacheHandle& c, int64_t layer, rt::LayerScales const& scales)
            { c.manager().setLayerScales(c.layerForManager(layer), scales); },
            nb::arg("layer"), nb::arg("scales"), kSET_LAYER_SCALES_DOC)
        .def(
            "k_pool_ptr",
            [](CacheHandle& c, int64_t layer)
            { return reinterpret_cast<uintptr_t>(c.manager().kPoolPtr(c.layer(layer))); },
            nb::arg("layer"), "Address of the layer's K pool.")
        .def(
            "v_pool_ptr",
            [](CacheHandle& c, int64_t layer)
            { return reinterpret_cast<uintptr_t>(c.manager().vPoolPtr(c.layer(layer))); },
            nb::arg("layer"), "Address of the layer's V pool (0 for a latent layer).")
        .def(
            "layer_ref", [](CacheHandle& c, int64_t layer) { return c.manager().layerRef(c.layer(layer)); },
            nb::arg("layer"), "The layer's pools as a kernel addresses them.")
        .def(
            "get_layer_config",
            [](CacheHandle& c, int64_t layer) { return c.manager().getLayerConfig(c.layer(layer)); }, nb::arg("layer"),
            "The layer's shape.")
        .def(
            "group", [](CacheHandle& c, int64_t group) { return c.manager().group(c.group(group)); }, nb::arg("group"),
            "Page group `group`'s layout.")
        .def(
            "group_of", [](CacheHandle& c, int64_t layer) { return c.manager().groupOf(c.layer(layer)); },
            nb::arg("layer"), "The page group of a layer.")
        .def(
            "num_pages", [](CacheHandle& c) { return c.manager().numPages(); }, "Pages per half of group 0.")
        .def(
            "min_pages", [](CacheHandle& c) { return c.manager().minPages(); }, "Group 0's minimum pages.")
        .def(
            "get_config", [](CacheHandle& c) { return c.manager().getConfig(); }, "A copy of the config.")
        .def(
            "layout", [](CacheHandle& c) { return c.manager().layout(); }, "A copy of the layout.")
        .def(
            "stream", [](CacheHandle& c) { return reinterpret_cast<uintptr_t>(c.stream()); },
            "The cache's stream handle.")
        .def("device", [](CacheHandle& c) { return c.manager().device(); })
        .def(
            "synchronize",
            [](CacheHandle& c)
            {
                nb::gil_scoped_release const released;
                KVCACHE_CUDA_TRY(cudaStreamSynchronize(c.stream()));
            },
            "Waits on the host for the work enqueued on the cache's stream.")
        .def("copy_pages", &copyPages, nb::arg("pairs"), nb::arg("stream") = nb::none(), nb::kw_only(),
            nb::arg("target") = nb::none(), nb::arg("group") = nb::none(), nb::arg("count") = nb::none(),
            nb::arg("error_count") = nb::none(), kCOPY_PAGES_DOC)
        .def("copy_states", &copyStates, nb::arg("pairs"), nb::arg("stream") = nb::none(), kCOPY_STATES_DOC)
        .def("reset_pages", &resetPages, nb::arg("pages"), nb::arg("stream") = nb::none(), nb::kw_only(),
            nb::arg("pattern") = 0, nb::arg("target") = nb::none(), nb::arg("group") = nb::none(),
            nb::arg("count") = nb::none(), nb::arg("error_count") = nb::none(), kRESET_PAGES_DOC);
    managerAccessors(cls, "num_layers", &rt::KVCacheManager::numLayers, "max_cap_padded",
        &rt::KVCacheManager::maxCapPadded, "tokens_per_page", &rt::KVCacheManager::tokensPerPage, "num_groups",
        &rt::KVCacheManager::numGroups, "num_state_layers", &rt::KVCacheManager::numStateLayers, "num_state_slots",
        &rt::KVCacheManager::numStateSlots, "is_uniform", &rt::KVCacheManager::isUniform, "allocated_bytes",
        &rt::KVCacheManager::allocatedBytes);

    m.def(
        "_time_copy_pages_cpp",
        [](CacheHandle& cache, nb::handle pairs, int64_t iterations, int64_t batch)
        {
            hostPagePairs(pairs, cache.pairs);
            std::vector<rt::PageCopy> const list = cache.pairs;
            double seconds = 0.0;
            nb::gil_scoped_release const released;
            for (int64_t done = 0; done < iterations;)
            {
                int64_t const calls = std::min(batch, iterations - done);
                auto const start = std::chrono::steady_clock::now();
                for (int64_t i = 0; i < calls; ++i)
                {
                    rt::copyPages(cache.manager(), list, cache.stream());
                }
                seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                // Keeps the launch queue short, so that enqueueing never waits for the GPU.
                KVCACHE_CUDA_TRY(cudaStreamSynchronize(cache.stream()));
                done += calls;
            }
            return seconds;
        },
        nb::arg("cache"), nb::arg("pairs"), nb::arg("iterations"), nb::arg("batch") = 64,
        "Benchmark helper: seconds spent in `iterations` C++ copyPages calls of `pairs` on the cache's stream "
        "(enqueue time only; the stream is drained every `batch` calls outside the timing).");
}

} // namespace kvcache::python

// Other binding files reach a KVCacheManager object through these (declared in write_binding.h).
#include "write_binding.h" // NOLINT: kept beside the appended definitions

namespace kvcache::python
{

CacheAccess cacheAccess(nb::handle cache)
{
    auto* const handle = checkedCast<CacheHandle*>(cache, "cache", "a KVCacheManager");
    return CacheAccess{&handle->manager(), handle->stream()};
}

DLPackView cacheView(nb::handle cache, rt::Tensor const& tensor)
{
    Self self;
    self.h = cache;
    self.p = checkedCast<CacheHandle*>(cache, "cache", "a KVCacheManager");
    return viewOf(self, tensor);
}

} // namespace kvcache::python
