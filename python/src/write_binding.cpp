// write_tokens, write_tokens_paged and read_tokens over tensors taken zero-copy through DLPack (torch, CuPy, JAX:
// float32, float16 or bfloat16, any strides with the last dimension contiguous), and the latent pool view.

#include "write_binding.h"

#include "cuda_arguments.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/memory/kv_write.h>

#include <fmt/format.h>
#include <nanobind/ndarray.h>

#include <cstdint>

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

//! The parts every call shares: the cache, the stream, the tensors and the options.
struct Call
{
    Call(nb::handle cacheObject, nb::handle k, nb::handle v, nb::handle stream, nb::handle count, nb::handle errorCount,
        int64_t group)
        : cache(cacheAccess(cacheObject))
        , device(cache.manager->device())
        , opStream(streamArgument(stream, cache.stream))
        , kTensor(tensorArgument(k, device, "k"))
        , vTensor(tensorArgument(v, device, "v"))
    {
        options.deviceCount = deviceArgument<int32_t>(count, device, 1, "count");
        options.deviceErrorCount = deviceArgument<int32_t>(errorCount, device, 1, "error_count");
        options.group = toInt32(group, "group");
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
    rt::TokenOpOptions options;
};

void writeTokens(CacheArgument const& cache, int64_t layer, DeviceArrayArgument const& k, DeviceArrayArgument const& v,
    DeviceArrayArgument const& tokenAddresses, StreamArgument const& stream, DeviceArrayArgument const& count,
    DeviceArrayArgument const& errorCount, int64_t group)
{
    Call const call(cache, k, v, stream, count, errorCount, group);
    int64_t const* addresses =
        deviceArgument<int64_t const>(tokenAddresses, call.device, call.capacity(), "token_addresses");
    rt::writeTokens(*call.cache.manager, toInt32(layer, "layer"), call.kTensor, call.vTensor, addresses, call.opStream,
        call.options);
}

void writeTokensPaged(CacheArgument const& cache, int64_t layer, DeviceArrayArgument const& k,
    DeviceArrayArgument const& v, DeviceArrayArgument const& indptr, DeviceArrayArgument const& indices,
    DeviceArrayArgument const& firstToken, DeviceArrayArgument const& positions, StreamArgument const& stream,
    DeviceArrayArgument const& count, DeviceArrayArgument const& errorCount, int64_t group)
{
    Call const call(cache, k, v, stream, count, errorCount, group);
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
    rt::writeTokens(*call.cache.manager, toInt32(layer, "layer"), call.kTensor, call.vTensor, table, pairs,
        call.opStream, call.options);
}

void readTokens(CacheArgument const& cache, int64_t layer, DeviceArrayArgument const& k, DeviceArrayArgument const& v,
    DeviceArrayArgument const& tokenAddresses, StreamArgument const& stream, DeviceArrayArgument const& count,
    DeviceArrayArgument const& errorCount)
{
    Call const call(cache, k, v, stream, count, errorCount, -1);
    int64_t const* addresses =
        deviceArgument<int64_t const>(tokenAddresses, call.device, call.capacity(), "token_addresses");
    rt::readTokens(*call.cache.manager, toInt32(layer, "layer"), call.kTensor, call.vTensor, addresses, call.opStream,
        call.options);
}

} // namespace

void bindWrite(nb::module_& m)
{
    m.def("write_tokens", &writeTokens, nb::arg("cache"), nb::arg("layer"), nb::arg("k"), nb::arg("v").none(),
        nb::arg("token_addresses"), nb::arg("stream") = nb::none(), nb::kw_only(), nb::arg("count") = nb::none(),
        nb::arg("error_count") = nb::none(), nb::arg("group") = -1,
        "Writes k and v ([n, num_kv_heads, head_dim] CUDA tensors of float32, float16 or bfloat16, any strides with "
        "the last dimension contiguous; v None for a latent layer) into layer `layer`'s pages at `token_addresses` "
        "(CUDA int64 [n]: page * tokens_per_page + offset; negative skips the token), converting to the cache's type "
        "(a quantized cache: quantized by docs/layout.md's rules, head_dim a multiple of 16, scales written where "
        "scale_pool_view shows them), in one launch on `stream` (default: the cache's). `count` (CUDA int32 [1]) "
        "limits the tokens on the device; `error_count` (CUDA int32 [1]) counts addresses past the layer's pages; "
        "`group` checks the addresses' page group. Graph-capturable.");
    m.def("write_tokens_paged", &writeTokensPaged, nb::arg("cache"), nb::arg("layer"), nb::arg("k"),
        nb::arg("v").none(), nb::arg("indptr"), nb::arg("indices"), nb::arg("first_token").none(), nb::arg("positions"),
        nb::arg("stream") = nb::none(), nb::kw_only(), nb::arg("count") = nb::none(),
        nb::arg("error_count") = nb::none(), nb::arg("group") = -1,
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

    nb::object const cls = m.attr("KVCacheManager");
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
