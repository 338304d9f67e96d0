#include "kvcache/kv_cache_layout.h"

#include "kvcache/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>

namespace kvcache::rt
{
namespace
{

std::string supportedTypeNames()
{
    std::string names;
    for (DataType const type : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kFP8_E4M3,
             DataType::kFP8_E5M2, DataType::kINT8, DataType::kUINT8})
    {
        names += names.empty() ? "" : ", ";
        names += dataTypeName(type);
    }
    return names;
}

//! a * b, or InvalidConfigError naming `what` when the product leaves int64.
int64_t checkedMul(int64_t a, int64_t b, std::string const& what)
{
    int64_t product = 0;
    if (__builtin_mul_overflow(a, b, &product))
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig: {} = {} x {} overflows 64-bit sizes (limit {})", what, a,
            b, std::numeric_limits<int64_t>::max()));
    }
    return product;
}

int64_t checkedAdd(int64_t a, int64_t b, std::string const& what)
{
    int64_t sum = 0;
    if (__builtin_add_overflow(a, b, &sum))
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig: {} = {} + {} overflows 64-bit sizes (limit {})", what, a,
            b, std::numeric_limits<int64_t>::max()));
    }
    return sum;
}

} // namespace

KVCacheLayout computeLayout(KVCacheConfig const& config)
{
    if (!isKVCacheDataType(config.kvCacheType))
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.kvCacheType is {} (value {}), which a KV cache does not "
                                             "support; supported: {}",
            dataTypeName(config.kvCacheType), static_cast<int32_t>(config.kvCacheType), supportedTypeNames()));
    }
    if (config.numAttentionLayers < 0)
    {
        throw InvalidConfigError(
            fmt::format("KVCacheConfig.numAttentionLayers is {}; it must be >= 0", config.numAttentionLayers));
    }
    if (config.maxBatchSize <= 0)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.maxBatchSize is {}; it must be > 0", config.maxBatchSize));
    }
    if (config.maxSequenceLength <= 0)
    {
        throw InvalidConfigError(
            fmt::format("KVCacheConfig.maxSequenceLength is {}; it must be > 0", config.maxSequenceLength));
    }
    int32_t const tokensPerPage = config.tokensPerPage;
    if (tokensPerPage < 1 || tokensPerPage > kMAX_TOKENS_PER_PAGE || (tokensPerPage & (tokensPerPage - 1)) != 0)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.tokensPerPage is {}; it must be a power of two in [1, {}]",
            tokensPerPage, kMAX_TOKENS_PER_PAGE));
    }
    if (config.layerConfigs.size() != static_cast<size_t>(config.numAttentionLayers))
    {
        throw InvalidConfigError(
            fmt::format("KVCacheConfig.layerConfigs has {} entries; it must have numAttentionLayers = {}",
                config.layerConfigs.size(), config.numAttentionLayers));
    }
    for (size_t i = 0; i < config.layerConfigs.size(); ++i)
    {
        KVLayerConfig const& layer = config.layerConfigs[i];
        if (layer.numKVHeads <= 0)
        {
            throw InvalidConfigError(
                fmt::format("KVCacheConfig.layerConfigs[{}].numKVHeads is {}; it must be > 0", i, layer.numKVHeads));
        }
        if (layer.headDim <= 0)
        {
            throw InvalidConfigError(
                fmt::format("KVCacheConfig.layerConfigs[{}].headDim is {}; it must be > 0", i, layer.headDim));
        }
    }

    int64_t const pagesPerSlot = (int64_t{config.maxSequenceLength} + tokensPerPage - 1) / tokensPerPage;
    int64_t const capPadded = pagesPerSlot * tokensPerPage;
    if (capPadded > std::numeric_limits<int32_t>::max())
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.maxSequenceLength is {}; rounded up to whole pages of {} "
                                             "tokens it is {}, over the int32 limit {}",
            config.maxSequenceLength, tokensPerPage, capPadded, std::numeric_limits<int32_t>::max()));
    }
    int64_t const minPages = int64_t{config.maxBatchSize} * pagesPerSlot;
    if (minPages > kMAX_NUM_PAGES)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig: the minimum page count maxBatchSize ({}) x pagesPerSlot "
                                             "({}) = {} exceeds {}, the largest count whose V page ids fit in int32",
            config.maxBatchSize, pagesPerSlot, minPages, kMAX_NUM_PAGES));
    }
    if (config.numPages < 0 || config.numPages > kMAX_NUM_PAGES)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.numPages is {}; it must be in [0, {}] so that 2 * numPages "
                                             "fits in int32",
            config.numPages, kMAX_NUM_PAGES));
    }
    if (config.numPages != 0 && config.numPages < minPages)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.numPages is {}; it must be 0 or at least the minimum {} "
                                             "(maxBatchSize {} x {} pages per slot)",
            config.numPages, minPages, config.maxBatchSize, pagesPerSlot));
    }

    KVCacheLayout layout;
    layout.maxBatchSize = config.maxBatchSize;
    layout.dataType = config.kvCacheType;
    layout.tokensPerPage = tokensPerPage;
    layout.capPadded = static_cast<int32_t>(capPadded);
    layout.pagesPerSlot = static_cast<int32_t>(pagesPerSlot);
    layout.minPages = static_cast<int32_t>(minPages);
    layout.numPages = config.numPages == 0 ? layout.minPages : config.numPages;
    layout.elementBytes = dataTypeSize(config.kvCacheType);
    layout.layers.reserve(config.layerConfigs.size());
    for (size_t i = 0; i < config.layerConfigs.size(); ++i)
    {
        KVLayerConfig const& layerConfig = config.layerConfigs[i];
        std::string const where = fmt::format("layer {} ", i);
        KVLayerLayout layer;
        layer.numKVHeads = layerConfig.numKVHeads;
        layer.headDim = layerConfig.headDim;
        layer.pageElems = checkedMul(checkedMul(tokensPerPage, layerConfig.numKVHeads, where + "page elements"),
            layerConfig.headDim, where + "page elements");
        layer.pageBytes = checkedMul(layer.pageElems, layout.elementBytes, where + "page bytes");
        layer.halfElems = checkedMul(layout.numPages, layer.pageElems, where + "elements per half");
        layer.layerBytes =
            checkedMul(checkedMul(2, layer.halfElems, where + "elements"), layout.elementBytes, where + "bytes");
        layout.cacheBytes = checkedAdd(layout.cacheBytes, layer.layerBytes, "total cache bytes");
        layout.bytesPerPage = checkedAdd(layout.bytesPerPage, 2 * layer.pageBytes, "bytes per page");
        layout.layers.push_back(layer);
    }
    return layout;
}

int64_t maxPagesForBudget(KVCacheConfig const& config, int64_t budgetBytes)
{
    if (budgetBytes < 0)
    {
        throw InvalidArgumentError(fmt::format("maxPagesForBudget: budgetBytes is {}; it must be >= 0", budgetBytes));
    }
    KVCacheConfig minimal = config;
    minimal.numPages = 0;
    KVCacheLayout const layout = computeLayout(minimal);
    if (layout.bytesPerPage == 0)
    {
        return kMAX_NUM_PAGES;
    }
    return std::min<int64_t>(budgetBytes / layout.bytesPerPage, kMAX_NUM_PAGES);
}

} // namespace kvcache::rt
