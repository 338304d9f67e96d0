// write_tokens, write_tokens_paged and read_tokens over tensors taken zero-copy through DLPack (torch, CuPy, JAX:
// float32, float16 or bfloat16, any strides with the last dimension contiguous), and the latent pool view.

#include "write_binding.h"

#include "cuda_arguments.h"
#include "typed_arguments.h"

#include <kvcache/core/device_allocation.h>
#include <kvcache/core/errors.h>
#include <kvcache/memory/kv_write.h>

#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

namespace kvcache::python
{
namespace
{

using CudaTensor = nb::ndarray<nb::device::cuda>;

rt::DataType valueType(nb::dlpack::dtype dtype, char const* name)
{
    auto const code = static_cast<nb::dlpack::dtype_code>(dtype.code);
    if (dtype.lanes == 1 && code == nb::dlpack::dtype_code::Float && (dtype.bits == 32 || dtype.bits == 16))
    {
        return dtype.bits == 32 ? rt::DataType::kFLOAT : rt::DataType::kHALF;
    }
    if (dtype.lanes == 1 && code == nb::dlpack::dtype_code::Bfloat && dtype.bits == 16)
    {
        return rt::DataType::kBF16;
    }
    throw rt::InvalidArgumentError(fmt::format("{} has DLPack type code {}, {} bits; it must be float32, float16 or "
                                               "bfloat16",
        name, dtype.code, dtype.bits));
}

//! Returns `object` (a CUDA tensor on `device`, or None: an empty tensor) as a strided Tensor.
rt::Tensor tensorArgument(nb::handle object, int32_t device, char const* name)
{
    if (object.is_none())
    {
        return rt::Tensor();
    }
    CudaTensor array;
    if (!nb::try_cast(object, array, false))
    {
        throw rt::InvalidArgumentError(fmt::format("{} must be a CUDA tensor (DLPack) or None", name));
    }
    if (array.ndim() != 3)
    {
        throw rt::InvalidArgumentError(
            fmt::format("{} has {} dimensions; it must have 3: [tokens, num_kv_heads, head_dim]", name, array.ndim()));
    }
    if (array.device_id() != device)
    {
        throw rt::InvalidArgumentError(
            fmt::format("{} is on device {}; the cache is on device {}", name, array.device_id(), device));
    }
    return rt::Tensor(array.data(),
        rt::Coords{static_cast<int64_t>(array.shape(0)), static_cast<int64_t>(array.shape(1)),
            static_cast<int64_t>(array.shape(2))},
        rt::Coords{array.stride(0), array.stride(1), array.stride(2)}, valueType(array.dtype(), name),
        rt::DeviceType::kGPU);
}

//! Returns the device data of `object`, a contiguous CUDA array of `entries` T on `device` (`entries` < 0: any).
template <typename T>
T* deviceArgument(nb::handle object, int32_t device, int64_t entries, char const* name)
{
    if (object.is_none())
    {
        return nullptr;
    }
    nb::ndarray<T, nb::c_contig, nb::device::cuda> array;
    if (!nb::try_cast(object, array, false))
    {
        throw rt::InvalidArgumentError(
            fmt::format("{} must be a contiguous CUDA array of {}", name, sizeof(T) == 8 ? "int64" : "int32"));
    }
    if (array.device_id() != device || (entries >= 0 && static_cast<int64_t>(array.size()) != entries))
    {
        throw rt::InvalidArgumentError(fmt::format("{} holds {} entries on device {}; it must hold {} on device {}",
            name, array.size(), array.device_id(), entries, device));
    }
    return array.data();
}

//! Every layer's WriteCounters of one cache, in device memory of its own (zeroed at creation), with the cache object
//! kept alive so that writes can check they are given the counters of their cache.
class WriteCountersHandle
{
public:
    explicit WriteCountersHandle(nb::handle cacheObject)
        : mCacheObject(nb::borrow(cacheObject))
        , mCache(cacheAccess(cacheObject))
    {
        int32_t const layers = mCache.manager->numLayers();
        if (layers == 0)
        {
            throw rt::InvalidArgumentError("WriteCounters: the cache has no attention layers to count");
        }
        mMemory = rt::DeviceAllocation(int64_t{layers} * sizeof(rt::WriteCounters), mCache.stream);
        reset(mCache.stream);
    }

    //! Zeroes every layer's counters, stream-ordered.
    void reset(cudaStream_t stream)
    {
        KVCACHE_CUDA_TRY(cudaMemsetAsync(mMemory.data(), 0, static_cast<size_t>(mMemory.size()), stream));
    }
    //! Returns layer `layer`'s counters in device memory, after checking they are `cache`'s.
    rt::WriteCounters* layerCounters(rt::KVCacheManager const* cache, int32_t layer) const
    {
        if (cache != mCache.manager)
        {
            throw rt::InvalidArgumentError("counters belong to another KVCacheManager; make them with "
                                           "WriteCounters(cache) for the cache written");
        }
        if (layer < 0 || layer >= numLayers())
        {
            throw rt::OutOfRangeError(
                fmt::format("counters: layer index {} is out of range [0, {})", layer, numLayers()));
        }
        return static_cast<rt::WriteCounters*>(mMemory.data()) + layer;
    }
    //! Returns a host copy of every layer's counters, waiting for `stream`'s work (a sync).
    std::vector<rt::WriteCounters> read(cudaStream_t stream) const
    {
        std::vector<rt::WriteCounters> host(static_cast<size_t>(numLayers()));
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(
            host.data(), mMemory.data(), static_cast<size_t>(mMemory.size()), cudaMemcpyDeviceToHost, stream));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
        return host;
    }
    //! A view of one field pair of every layer's counters: [num_layers, 2] at `offset` bytes, `type` elements, the
    //! layers 24 bytes apart.
    DLPackView fieldView(nb::handle self, int64_t offset, rt::DataType type) const
    {
        int64_t const elementBytes = type == rt::DataType::kFLOAT ? 4 : 8;
        auto const stride = static_cast<int64_t>(sizeof(rt::WriteCounters)) / elementBytes;
        rt::Tensor const tensor(static_cast<char*>(mMemory.data()) + offset, rt::Coords{numLayers(), 2},
            rt::Coords{stride, 1}, type, rt::DeviceType::kGPU);
        return DLPackView(tensor, kDLCUDA, mCache.manager->device(), nullptr, nb::borrow(self));
    }
    int32_t numLayers() const noexcept
    {
        return mCache.manager->numLayers();
    }
    cudaStream_t stream() const noexcept
    {
        return mCache.stream;
    }

private:
    nb::object mCacheObject;
    CacheAccess mCache;
    rt::DeviceAllocation mMemory;
};

//! The parts every call shares: the cache, the stream, the tensors and the options.
struct Call
{
    Call(nb::handle cacheObject, nb::handle k, nb::handle v, nb::handle stream, nb::handle count, nb::handle errorCount,
        int64_t group, int64_t layer, nb::handle counters = nb::none())
        : cache(cacheAccess(cacheObject))
        , device(cache.manager->device())
        , opStream(streamArgument(stream, cache.stream))
        , kTensor(tensorArgument(k, device, "k"))
        , vTensor(tensorArgument(v, device, "v"))
    {
        options.deviceCount = deviceArgument<int32_t>(count, device, 1, "count");
        options.deviceErrorCount = deviceArgument<int32_t>(errorCount, device, 1, "error_count");
        options.group = toInt32(group, "group");
        layerIdx = toInt32(layer, "layer");
        if (!counters.is_none())
        {
            WriteCountersHandle* handle = nullptr;
            if (!nb::try_cast(counters, handle, false) || handle == nullptr)
            {
                throw rt::InvalidArgumentError("counters must be a WriteCounters (WriteCounters(cache)) or None");
            }
            options.deviceCounters = handle->layerCounters(cache.manager, layerIdx);
        }
    }
    int64_t capacity() const
    {
        return kTensor.getShape().getNumDims() == 3 ? kTensor.getShape()[0] : 0;
    }

    CacheAccess cache;
    int32_t device;
    cudaStream_t opStream;
    rt::Tensor kTensor;
    rt::Tensor vTensor;
    int32_t layerIdx = 0;
    rt::TokenOpOptions options;
};

void writeTokens(CacheArgument const& cache, int64_t layer, DeviceArrayArgument const& k, DeviceArrayArgument const& v,
    DeviceArrayArgument const& tokenAddresses, StreamArgument const& stream, DeviceArrayArgument const& count,
    DeviceArrayArgument const& errorCount, int64_t group, WriteCountersArgument const& counters)
{
    Call const call(cache, k, v, stream, count, errorCount, group, layer, counters);
    int64_t const* addresses =
        deviceArgument<int64_t const>(tokenAddresses, call.device, call.capacity(), "token_addresses");
    rt::writeTokens(
        *call.cache.manager, call.layerIdx, call.kTensor, call.vTensor, addresses, call.opStream, call.options);
}

void writeTokensPaged(CacheArgument const& cache, int64_t layer, DeviceArrayArgument const& k,
    DeviceArrayArgument const& v, DeviceArrayArgument const& indptr, DeviceArrayArgument const& indices,
    DeviceArrayArgument const& firstToken, DeviceArrayArgument const& positions, StreamArgument const& stream,
    DeviceArrayArgument const& count, DeviceArrayArgument const& errorCount, int64_t group,
    WriteCountersArgument const& counters)
{
    Call const call(cache, k, v, stream, count, errorCount, group, layer, counters);
    rt::DevicePageTable table;
    nb::ndarray<int32_t const, nb::c_contig, nb::device::cuda> rows;
    if (!nb::try_cast(indptr, rows, false) || rows.size() == 0)
    {
        throw rt::InvalidArgumentError("indptr must be a contiguous CUDA int32 array of num_sequences + 1 entries");
    }
    table.indptr = rows.data();
    table.numSequences = toInt32(static_cast<int64_t>(rows.size()) - 1, "len(indptr) - 1");
    table.indices = deviceArgument<int32_t const>(indices, call.device, -1, "indices");
    table.firstToken = deviceArgument<int32_t const>(firstToken, call.device, table.numSequences, "first_token");
    // [capacity, 2] int32 pairs are TokenPosition's layout.
    auto const* pairs = reinterpret_cast<rt::TokenPosition const*>(
        deviceArgument<int32_t const>(positions, call.device, 2 * call.capacity(), "positions"));
    rt::writeTokens(
        *call.cache.manager, call.layerIdx, call.kTensor, call.vTensor, table, pairs, call.opStream, call.options);
}

void readTokens(CacheArgument const& cache, int64_t layer, DeviceArrayArgument const& k, DeviceArrayArgument const& v,
    DeviceArrayArgument const& tokenAddresses, StreamArgument const& stream, DeviceArrayArgument const& count,
    DeviceArrayArgument const& errorCount)
{
    Call const call(cache, k, v, stream, count, errorCount, -1, layer);
    int64_t const* addresses =
        deviceArgument<int64_t const>(tokenAddresses, call.device, call.capacity(), "token_addresses");
    rt::readTokens(
        *call.cache.manager, call.layerIdx, call.kTensor, call.vTensor, addresses, call.opStream, call.options);
}

} // namespace

void bindWrite(nb::module_& m)
{
    m.def("write_tokens", &writeTokens, nb::arg("cache"), nb::arg("layer"), nb::arg("k"), nb::arg("v").none(),
        nb::arg("token_addresses"), nb::arg("stream") = nb::none(), nb::kw_only(), nb::arg("count") = nb::none(),
        nb::arg("error_count") = nb::none(), nb::arg("group") = -1, nb::arg("counters") = nb::none(),
        "Writes k and v ([n, num_kv_heads, head_dim] CUDA tensors of float32, float16 or bfloat16, any strides with "
        "the last dimension contiguous; v None for a latent layer) into layer `layer`'s pages at `token_addresses` "
        "(CUDA int64 [n]: page * tokens_per_page + offset; negative skips the token), converting to the cache's type "
        "(a quantized cache: quantized by docs/layout.md's rules, head_dim a multiple of 16, scales written where "
        "scale_pool_view shows them), in one launch on `stream` (default: the cache's). `count` (CUDA int32 [1]) "
        "limits the tokens on the device; `error_count` (CUDA int32 [1]) counts addresses past the layer's pages; "
        "`group` checks the addresses' page group; `counters` (a WriteCounters of this cache, quantized caches only) "
        "records the layer's amax and saturated values (docs/layout.md, \"Calibration\"). Graph-capturable.");
    m.def("write_tokens_paged", &writeTokensPaged, nb::arg("cache"), nb::arg("layer"), nb::arg("k"),
        nb::arg("v").none(), nb::arg("indptr"), nb::arg("indices"), nb::arg("first_token").none(), nb::arg("positions"),
        nb::arg("stream") = nb::none(), nb::kw_only(), nb::arg("count") = nb::none(),
        nb::arg("error_count") = nb::none(), nb::arg("group") = -1, nb::arg("counters") = nb::none(),
        "As write_tokens, each token placed by its (sequence, position) row of `positions` (CUDA int32 [n, 2]) in the "
        "CSR table indptr / indices / first_token of the layer's group (as PageTableBuffers builds them; first_token "
        "None means 0). Positions outside a row's pages are counted in error_count.");
    m.def("read_tokens", &readTokens, nb::arg("cache"), nb::arg("layer"), nb::arg("k"), nb::arg("v").none(),
        nb::arg("token_addresses"), nb::arg("stream") = nb::none(), nb::kw_only(), nb::arg("count") = nb::none(),
        nb::arg("error_count") = nb::none(),
        "Gathers the tokens at `token_addresses` of layer `layer` into k and v (contiguous CUDA tensors [n, "
        "num_kv_heads, head_dim] of float32, float16 or bfloat16; v None for a latent layer), converting from the "
        "cache's type (dequantizing a quantized cache's values), in one launch on `stream`. Rows of skipped or bad "
        "addresses are left as they were.");

    nb::class_<rt::WriteCounters>(m, "LayerWriteCounters",
        "A host copy of one layer's write counters (WriteCounters.read): the largest finite |value| written to K and "
        "V, "
        "and the values the encoding clipped (docs/layout.md, \"Calibration\").")
        .def(nb::init<>())
        .def(
            "__init__",
            [](rt::WriteCounters* self, float kAmax, float vAmax, uint64_t kSaturated, uint64_t vSaturated) {
                new (self) rt::WriteCounters{kAmax, vAmax, kSaturated, vSaturated};
            },
            nb::arg("k_amax"), nb::arg("v_amax"), nb::arg("k_saturated") = 0, nb::arg("v_saturated") = 0)
        .def_rw("k_amax", &rt::WriteCounters::kAmax, "Largest finite |value| written to K (0: none).")
        .def_rw("v_amax", &rt::WriteCounters::vAmax, "Largest finite |value| written to V (0: none).")
        .def_rw("k_saturated", &rt::WriteCounters::kSaturated, "K values the encoding clipped.")
        .def_rw("v_saturated", &rt::WriteCounters::vSaturated, "V values the encoding clipped.");

    nb::class_<WriteCountersHandle>(m, "WriteCounters",
        "Every layer's write counters of one cache, in device memory of their own, zeroed at creation. Pass them to "
        "write_tokens / write_tokens_paged (counters=): a write into a quantized cache raises its layer's amax and "
        "saturation counts on the device, with no sync; read them on a later step through amax() / saturated() "
        "(DLPack views) or read() (a host copy, which waits).")
        .def(
            "__init__",
            [](WriteCountersHandle* self, CacheArgument const& cache) { new (self) WriteCountersHandle(cache); },
            nb::arg("cache"), "Counters for every layer of `cache` (a KVCacheManager).")
        .def_prop_ro("num_layers", &WriteCountersHandle::numLayers)
        .def(
            "reset",
            [](WriteCountersHandle& self, StreamArgument const& stream)
            { self.reset(streamArgument(stream, self.stream())); },
            nb::arg("stream") = nb::none(),
            "Zeroes every layer's counters, stream-ordered (default: the cache's stream).")
        .def(
            "amax",
            [](nb::handle self)
            { return nb::cast<WriteCountersHandle&>(self).fieldView(self, 0, rt::DataType::kFLOAT); },
            "View float32 [num_layers, 2] (K, V) of the amax counters, zero-copy.")
        .def(
            "saturated",
            [](nb::handle self)
            { return nb::cast<WriteCountersHandle&>(self).fieldView(self, 8, rt::DataType::kINT64); },
            "View int64 [num_layers, 2] (K, V) of the saturation counts (unsigned 64-bit on the device), zero-copy.")
        .def(
            "read",
            [](WriteCountersHandle const& self, StreamArgument const& stream)
            { return self.read(streamArgument(stream, self.stream())); },
            nb::arg("stream") = nb::none(),
            "A host copy of every layer's counters (list of LayerWriteCounters), after waiting for `stream` (default: "
            "the cache's stream).");

    m.def("calibrated_scales", &rt::calibratedScales, nb::arg("quantization"), nb::arg("k_amax"), nb::arg("v_amax"),
        nb::arg("has_v") = true,
        "The host-held scales docs/layout.md's calibration gives for observed amax: amax / 448 (FP8_PER_TENSOR), "
        "amax / (448 * 6) (NVFP4 global scales). Raises InvalidArgumentError for another quantization, and for an amax "
        "that is not finite and > 0, naming it.");

    nb::object const cls = m.attr("KVCacheManager");
    nb::setattr(cls, "calibrate_layer_scales",
        nb::cpp_function(
            [](nb::handle self, int64_t layer, rt::WriteCounters const& observed)
            {
                CacheAccess const cache = cacheAccess(self);
                rt::calibrateLayerScales(*cache.manager, toInt32(layer, "layer"), observed);
            },
            nb::is_method(), nb::scope(cls), nb::name("calibrate_layer_scales"), nb::arg("layer"), nb::arg("observed"),
            "Sets the layer's host-held scales from `observed` (a LayerWriteCounters, e.g. "
            "WriteCounters.read()[layer]) "
            "by calibrated_scales; a latent layer's v is kept. Raises as calibrated_scales and set_layer_scales do; a "
            "refused call changes nothing."));
    nb::setattr(cls, "attention_arguments",
        nb::cpp_function(
            [](nb::handle self, int64_t layer)
            {
                CacheAccess const cache = cacheAccess(self);
                rt::AttentionArguments const arguments = cache.manager->attentionArguments(toInt32(layer, "layer"));
                auto const view = [&](rt::Tensor const& tensor) -> nb::object
                {
                    if (tensor.rawPointer() == nullptr)
                    {
                        return nb::none();
                    }
                    return nb::cast(cacheView(self, tensor));
                };
                nb::dict result;
                result["quantization"] = arguments.quantization;
                result["k_scale"] = arguments.kScale;
                result["v_scale"] = arguments.vScale;
                result["k_scale_pool"] = view(arguments.kScalePool);
                result["v_scale_pool"] = view(arguments.vScalePool);
                result["token_head_scales"] = arguments.tokenHeadScales;
                result["tensor_core_decode"] = arguments.tensorCoreDecode;
                return result;
            },
            nb::is_method(), nb::scope(cls), nb::name("attention_arguments"), nb::arg("layer"),
            "What an attention kernel takes for the layer's quantization, as a dict (docs/flashinfer.md): "
            "`quantization`; `k_scale` / `v_scale`, the factors every K / V value is multiplied by after its page "
            "scale (FP8_PER_TENSOR's scales, NVFP4's global scales; 1.0 otherwise and for a latent layer's V); "
            "`k_scale_pool` / `v_scale_pool`, the scale pool's K and V halves as zero-copy views (FlashInfer's "
            "kv_cache_sf; None without page scales, and V for a latent layer); `token_head_scales` (FlashInfer's "
            "use_token_head_sf); `tensor_core_decode`: only a tensor-core decode reads the page scales. The scales are "
            "a copy taken now. Raises OutOfRangeError for a bad index."));
    nb::setattr(cls, "latent_pool_view",
        nb::cpp_function(
            [](nb::handle self, int64_t layer)
            {
                CacheAccess const cache = cacheAccess(self);
                return cacheView(self, cache.manager->latentPoolView(toInt32(layer, "layer")));
            },
            nb::is_method(), nb::scope(cls), nb::name("latent_pool_view"), nb::arg("layer"),
            "View [num_pages, tokens_per_page, head_dim] of latent layer `layer`'s pool, as MLA kernels take it: each "
            "token's kv_lora_rank values, then its rope part. Raises for a KV layer."));
}

} // namespace kvcache::python
