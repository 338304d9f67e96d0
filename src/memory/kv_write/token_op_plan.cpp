#include "memory/kv_write/token_op_plan.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace kvcache::rt::detail
{
namespace
{

bool isTokenValueType(DataType type) noexcept
{
    return type == DataType::kFLOAT || type == DataType::kHALF || type == DataType::kBF16;
}

//! Returns the element offset of the tensor's last element, or throws when it overflows int64.
int64_t lastElementOffset(char const* what, char const* name, Tensor const& tensor)
{
    Coords const& shape = tensor.getShape();
    Coords const& stride = tensor.getStride();
    int64_t offset = 0;
    for (int32_t dim = 0; dim < 3; ++dim)
    {
        int64_t term = 0;
        if (shape[dim] > 0
            && (__builtin_mul_overflow(shape[dim] - 1, stride[dim], &term)
                || __builtin_add_overflow(offset, term, &offset)))
        {
            throw InvalidArgumentError(fmt::format("{}: {}'s last element lies more than {} elements from its start "
                                                   "(shape [{}, {}, {}], strides [{}, {}, {}])",
                what, name, std::numeric_limits<int64_t>::max(), shape[0], shape[1], shape[2], stride[0], stride[1],
                stride[2]));
        }
    }
    return offset;
}

void checkTensor(char const* what, char const* name, Tensor const& tensor, KVLayerLayout const& layer, int32_t layerIdx,
    TokenDirection direction)
{
    Coords const& shape = tensor.getShape();
    if (shape.getNumDims() != 3)
    {
        throw InvalidArgumentError(fmt::format("{}: {} has {} dimensions; it must have 3: [capacity, numKVHeads {}, "
                                               "headDim {}]",
            what, name, shape.getNumDims(), layer.numKVHeads, layer.headDim));
    }
    if (shape[1] != layer.numKVHeads || shape[2] != layer.headDim)
    {
        throw InvalidArgumentError(fmt::format("{}: {} has shape [{}, {}, {}]; layer {} needs [capacity, {}, {}]", what,
            name, shape[0], shape[1], shape[2], layerIdx, layer.numKVHeads, layer.headDim));
    }
    int64_t const limit = std::numeric_limits<int32_t>::max();
    if (shape[0] > limit)
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} holds {} tokens; the limit is {} (counts are int32)", what, name, shape[0], limit));
    }
    if (tensor.getDeviceType() != DeviceType::kGPU)
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} is host memory (DeviceType::kCPU); it must be device memory (kGPU)", what, name));
    }
    if (!isTokenValueType(tensor.getDataType()))
    {
        throw InvalidArgumentError(fmt::format("{}: {} has type {}; it must be float32, float16 or bfloat16", what,
            name, dataTypeName(tensor.getDataType())));
    }
    Coords const& stride = tensor.getStride();
    if (stride[2] != 1)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: {}'s stride over headDim is {}; it must be 1 (the last dimension contiguous)", what, name, stride[2]));
    }
    if (stride[0] < 0 || stride[1] < 0)
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} has strides [{}, {}, 1]; the token and head strides must be >= 0", what, name,
                stride[0], stride[1]));
    }
    if (direction == TokenDirection::kREAD && !tensor.isContiguous())
    {
        throw InvalidArgumentError(fmt::format("{}: output {} has strides [{}, {}, {}]; it must be contiguous [{}, {}, "
                                               "1]",
            what, name, stride[0], stride[1], stride[2], shape[1] * shape[2], shape[2]));
    }
    if (shape[0] > 0 && tensor.rawPointer() == nullptr)
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} is null with {} tokens; it must point to device memory", what, name, shape[0]));
    }
    lastElementOffset(what, name, tensor);
}

//! Returns true when every access of `tensor`'s rows starts on a vectorElems boundary of a 16-byte aligned pointer.
bool allowsVectors(Tensor const& tensor, int64_t vectorElems) noexcept
{
    Coords const& stride = tensor.getStride();
    return reinterpret_cast<uintptr_t>(tensor.rawPointer()) % kTOKEN_VECTOR_BYTES == 0 && stride[0] % vectorElems == 0
        && stride[1] % vectorElems == 0;
}

int32_t nextPowerOfTwo(int32_t value) noexcept
{
    int32_t power = 1;
    while (power < value)
    {
        power *= 2;
    }
    return power;
}

//! The quantizing kernel's launch: a head a group of lanes, a warp a token and as many of its heads as it has groups
//! (grid y the heads' groups), valuesPerLane values a lane.
void planQuantized(
    char const* what, KVLayerLayout const& layer, int32_t layerIdx, Tensor const& k, Tensor const& v, TokenOpPlan& plan)
{
    // Whole NVFP4 blocks and aligned code stores for every lane: 16 divides every head a quantized write serves.
    if (layer.headDim % kQUANT_HEAD_DIM_MULTIPLE != 0)
    {
        throw InvalidArgumentError(fmt::format("{}: layer {} has headDim {}; a quantized cache's tokens are moved only "
                                               "for head dimensions that are multiples of {}",
            what, layerIdx, layer.headDim, kQUANT_HEAD_DIM_MULTIPLE));
    }
    if (layer.headDim > 32 * kMAX_QUANT_VALUES_PER_LANE)
    {
        throw InvalidArgumentError(fmt::format("{}: layer {} has headDim {}; a quantized cache's tokens are moved only "
                                               "for head dimensions up to {}",
            what, layerIdx, layer.headDim, 32 * kMAX_QUANT_VALUES_PER_LANE));
    }
    // Two whole vectors of the tensor's type a lane (8 floats, 16 of a 16-bit type), more where 32 lanes would not
    // cover the head: a lane's address work (the token's address, the code and scale addresses) is spread over more
    // values, a head's amax takes fewer shuffles and an NVFP4 block is one lane's (no shuffle, one scale per lane).
    // Fewer values per lane write a long prefill slower (docs/benchmarks.md).
    int32_t perLane = 2 * kTOKEN_VECTOR_BYTES / static_cast<int32_t>(dataTypeSize(k.getDataType()));
    while (perLane * 32 < layer.headDim)
    {
        perLane *= 2;
    }
    plan.valuesPerLane = perLane;
    int32_t const lanes = nextPowerOfTwo((layer.headDim + perLane - 1) / perLane);
    while ((1 << plan.laneShift) < lanes)
    {
        ++plan.laneShift;
    }
    int32_t const headsPerWarp = 32 >> plan.laneShift;
    plan.gridY = (layer.numKVHeads + headsPerWarp - 1) / headsPerWarp;
    if (plan.gridY > kMAX_QUANT_GRID_Y)
    {
        throw InvalidArgumentError(
            fmt::format("{}: layer {} has numKVHeads {}; a quantized write serves at most {} ({} "
                        "heads a warp)",
                what, layerIdx, layer.numKVHeads, int64_t{kMAX_QUANT_GRID_Y} * headsPerWarp, headsPerWarp));
    }
    // A lane's chunk of perLane elements is aligned to min(its bytes, 16): rows must start on that many elements.
    int64_t const alignElems = std::min<int64_t>(perLane, kTOKEN_VECTOR_BYTES / dataTypeSize(k.getDataType()));
    plan.quantVectors = allowsVectors(k, alignElems) && (!plan.hasV || allowsVectors(v, alignElems));
    // A head's codes start storedDim bytes after the last head's: a lane's code bytes (of perLane values) start aligned
    // to their size, up to 16, only when storedDim is a multiple of it (not so for NVFP4 heads above 512 values that
    // are not multiples of 32).
    int64_t const codeBytes = layer.storedDim == layer.headDim ? perLane : perLane / 2;
    plan.codeVectors = layer.storedDim % std::min<int64_t>(codeBytes, kTOKEN_VECTOR_BYTES) == 0;
    plan.blockX = 32;
    plan.blockY = kQUANT_WARPS_PER_BLOCK;
    // A warp a token.
    plan.gridX = (int64_t{plan.capacity} + plan.blockY - 1) / plan.blockY;
}

} // namespace

TokenOpPlan planTokenOp(char const* what, KVCacheLayout const& layout, int32_t layerIdx, Tensor const& k,
    Tensor const& v, TokenOpOptions const& options, TokenDirection direction)
{
    int32_t const numLayers = static_cast<int32_t>(layout.layers.size());
    if (layerIdx < 0 || layerIdx >= numLayers)
    {
        throw OutOfRangeError(
            fmt::format("{}: layerIdx is {}; it must be in [0, {}) (numLayers)", what, layerIdx, numLayers));
    }
    bool const quantized = layout.quantization != KVQuantization::kNONE;
    if (!quantized && !isTokenValueType(layout.dataType))
    {
        throw InvalidArgumentError(fmt::format("{}: the cache's type is {} without quantization; tokens can be moved "
                                               "only into float32, float16 or bfloat16 caches, or quantized ones "
                                               "(KVCacheConfig.quantization: 8-bit values need scales)",
            what, dataTypeName(layout.dataType)));
    }
    KVLayerLayout const& layer = layout.layers[static_cast<size_t>(layerIdx)];
    if (options.group != -1 && options.group != layer.group)
    {
        throw InvalidArgumentError(fmt::format("{}: options.group is {}; layer {} belongs to group {} (page ids mean "
                                               "nothing across groups)",
            what, options.group, layerIdx, layer.group));
    }
    if (options.deviceCounters != nullptr)
    {
        if (direction == TokenDirection::kREAD)
        {
            throw InvalidArgumentError(fmt::format("{}: options.deviceCounters is given; a read records nothing (the "
                                                   "counters are the quantizing write's)",
                what));
        }
        if (!quantized)
        {
            throw InvalidArgumentError(
                fmt::format("{}: options.deviceCounters is given for a cache of quantization {}; "
                            "the counters are the quantizing write's (fp8_per_tensor, "
                            "fp8_per_token_head, nvfp4)",
                    what, kvQuantizationName(layout.quantization)));
        }
        auto const address = reinterpret_cast<uintptr_t>(options.deviceCounters);
        if (address % alignof(WriteCounters) != 0)
        {
            throw InvalidArgumentError(fmt::format("{}: options.deviceCounters is at {:#x}; it must be {}-byte aligned",
                what, address, alignof(WriteCounters)));
        }
    }
    checkTensor(what, "k", k, layer, layerIdx, direction);
    bool const hasV = layer.numHalves == 2;
    if (!hasV && (v.rawPointer() != nullptr || v.getShape().getNumDims() != 0))
    {
        throw InvalidArgumentError(fmt::format(
            "{}: v is given for layer {}, a latent layer; it must be an empty Tensor (latent layers have no V)", what,
            layerIdx));
    }
    if (hasV)
    {
        checkTensor(what, "v", v, layer, layerIdx, direction);
        if (v.getShape()[0] != k.getShape()[0] || v.getDataType() != k.getDataType())
        {
            throw InvalidArgumentError(fmt::format("{}: v is {} with {} tokens; it must match k: {} with {} tokens",
                what, dataTypeName(v.getDataType()), v.getShape()[0], dataTypeName(k.getDataType()), k.getShape()[0]));
        }
    }

    TokenOpPlan plan;
    plan.capacity = static_cast<int32_t>(k.getShape()[0]);
    plan.tensorType = k.getDataType();
    plan.cacheType = layout.dataType;
    plan.hasV = hasV;
    if (quantized)
    {
        planQuantized(what, layer, layerIdx, k, v, plan);
        plan.quantization = layout.quantization;
        return plan;
    }
    int64_t const vectorElems = kTOKEN_VECTOR_BYTES / layout.elementBytes;
    bool const vectors =
        layer.headDim % vectorElems == 0 && allowsVectors(k, vectorElems) && (!hasV || allowsVectors(v, vectorElems));
    plan.vectorElems = vectors ? static_cast<int32_t>(vectorElems) : 1;
    plan.chunksPerHead = layer.headDim / plan.vectorElems;
    // At most 65536 heads of 1024 elements (config limits keep it far below int32).
    plan.chunksPerToken = layer.numKVHeads * plan.chunksPerHead;
    // Short tokens share a block (and a warp) so no lane idles; long ones take whole warps, up to a block a token.
    plan.blockX = plan.chunksPerToken >= 32 ? std::min((plan.chunksPerToken + 31) / 32 * 32, kTOKEN_BLOCK_THREADS)
                                            : nextPowerOfTwo(plan.chunksPerToken);
    plan.blockY = std::max(1, kTOKEN_BLOCK_THREADS / plan.blockX);
    plan.gridX = (int64_t{plan.capacity} + plan.blockY - 1) / plan.blockY;
    return plan;
}

void validateTokenList(char const* what, char const* field, void const* list, int32_t capacity)
{
    if (capacity > 0 && list == nullptr)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: {} is null with capacity {}; it must point to {} device entries", what, field, capacity, capacity));
    }
}

void validatePageTable(char const* what, DevicePageTable const& table)
{
    if (table.numSequences < 0)
    {
        throw InvalidArgumentError(
            fmt::format("{}: table.numSequences is {}; it must be >= 0", what, table.numSequences));
    }
    if (table.indptr == nullptr || table.indices == nullptr)
    {
        throw InvalidArgumentError(fmt::format("{}: table.{} is null; it must point to the device page table", what,
            table.indptr == nullptr ? "indptr" : "indices"));
    }
}

} // namespace kvcache::rt::detail
