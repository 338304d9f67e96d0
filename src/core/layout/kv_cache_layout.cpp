#include "kvcache/core/kv_cache_layout.h"

#include "core/layout/kv_cache_layout_internal.h"
#include "core/layout/scale_support.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>

namespace kvcache::rt
{
namespace
{

using detail::checkedAdd;
using detail::checkedMul;

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

//! Throws InvalidConfigError when `config.quantization` is outside the enumeration, or when its storage type or a
//! layer's headDim cannot hold the format. Runs after the layers' own checks, so headDim is positive here.
void checkQuantization(KVCacheConfig const& config)
{
    KVQuantization const quantization = config.quantization;
    std::string_view const name = kvQuantizationName(quantization);
    switch (quantization)
    {
    case KVQuantization::kNONE: return;
    case KVQuantization::kFP8_PER_TENSOR:
    case KVQuantization::kFP8_PER_TOKEN_HEAD:
        // The scales are amax / 448, E4M3's largest finite value: the values must be stored as E4M3.
        if (config.kvCacheType != DataType::kFP8_E4M3)
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.quantization is {}, which stores FP8 E4M3 values; "
                                                 "kvCacheType is {} and must be {}",
                name, dataTypeName(config.kvCacheType), dataTypeName(DataType::kFP8_E4M3)));
        }
        return;
    case KVQuantization::kNVFP4:
        // Two 4-bit values a byte: views and FlashInfer read the data as uint8 [numPages, P, H, D / 2].
        if (config.kvCacheType != DataType::kUINT8)
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.quantization is {}, which packs two 4-bit values a "
                                                 "byte; kvCacheType is {} and must be {}",
                name, dataTypeName(config.kvCacheType), dataTypeName(DataType::kUINT8)));
        }
        for (size_t i = 0; i < config.layerConfigs.size(); ++i)
        {
            int32_t const headDim = config.layerConfigs[i].headDim;
            if (headDim % kNVFP4_BLOCK_VALUES != 0)
            {
                throw InvalidConfigError(fmt::format("KVCacheConfig.layerConfigs[{}].headDim is {}; quantization {} "
                                                     "scales blocks of {} values, so it must be a multiple of {}",
                    i, headDim, name, kNVFP4_BLOCK_VALUES, kNVFP4_BLOCK_VALUES));
            }
        }
        return;
    }
    throw InvalidConfigError(fmt::format("KVCacheConfig.quantization is {}; it must be kNONE (0), kFP8_PER_TENSOR (1), "
                                         "kFP8_PER_TOKEN_HEAD (2) or kNVFP4 (3)",
        static_cast<int32_t>(quantization)));
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
        if (layer.slidingWindow < 0)
        {
            throw InvalidConfigError(fmt::format(
                "KVCacheConfig.layerConfigs[{}].slidingWindow is {}; it must be >= 0 (0 means full attention)", i,
                layer.slidingWindow));
        }
        if (layer.kind != KVLayerKind::kKV && layer.kind != KVLayerKind::kLATENT)
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.layerConfigs[{}].kind is {}; it must be kKV (0) or "
                                                 "kLATENT (1)",
                i, static_cast<int32_t>(layer.kind)));
        }
        if (layer.kind == KVLayerKind::kLATENT && layer.numKVHeads != 1)
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.layerConfigs[{}].numKVHeads is {}; a latent layer "
                                                 "(kind kLATENT) caches one vector a token, so it must be 1",
                i, layer.numKVHeads));
        }
    }

    checkQuantization(config);

    if (config.maxTokensPerStep < 0 || config.maxTokensPerStep > config.maxSequenceLength)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.maxTokensPerStep is {}; it must be in [0, "
                                             "maxSequenceLength = {}] (0 means maxSequenceLength)",
            config.maxTokensPerStep, config.maxSequenceLength));
    }

    int64_t const fullPages = (int64_t{config.maxSequenceLength} + tokensPerPage - 1) / tokensPerPage;
    int64_t const capPadded = fullPages * tokensPerPage;
    if (capPadded > std::numeric_limits<int32_t>::max())
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.maxSequenceLength is {}; rounded up to whole pages of {} "
                                             "tokens it is {}, over the int32 limit {}",
            config.maxSequenceLength, tokensPerPage, capPadded, std::numeric_limits<int32_t>::max()));
    }
    int64_t const stepTokens = config.maxTokensPerStep == 0 ? config.maxSequenceLength : config.maxTokensPerStep;

    // Groups: full attention first, then each distinct window in ascending order.
    std::vector<int32_t> windows;
    for (KVLayerConfig const& layer : config.layerConfigs)
    {
        windows.push_back(layer.slidingWindow);
    }
    std::sort(windows.begin(), windows.end());
    windows.erase(std::unique(windows.begin(), windows.end()), windows.end());
    if (windows.empty())
    {
        windows.push_back(0); // no layers: the scalar fields still describe a full-attention slot
    }
    if (config.numPages != 0 && windows.size() > 1)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.numPages is {}; it must be 0 for a model of {} page groups "
                                             "(layers of different sliding windows): use numPagesPerGroup",
            config.numPages, windows.size()));
    }
    if (config.layerConfigs.empty() && !config.numPagesPerGroup.empty())
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.numPagesPerGroup has {} entries; it must be empty for a "
                                             "config of no layers, which has no page groups",
            config.numPagesPerGroup.size()));
    }
    if (!config.numPagesPerGroup.empty() && config.numPagesPerGroup.size() != windows.size())
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.numPagesPerGroup has {} entries; it must be empty or have "
                                             "one per page group ({})",
            config.numPagesPerGroup.size(), windows.size()));
    }
    if (config.numPages != 0 && !config.numPagesPerGroup.empty())
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig.numPages is {} and numPagesPerGroup is given; set only "
                                             "one of them",
            config.numPages));
    }

    KVCacheLayout layout;
    layout.maxBatchSize = config.maxBatchSize;
    layout.dataType = config.kvCacheType;
    layout.tokensPerPage = tokensPerPage;
    layout.maxTokensPerStep = static_cast<int32_t>(stepTokens);
    layout.maxSequenceLength = config.maxSequenceLength;
    layout.elementBytes = dataTypeSize(config.kvCacheType);
    layout.quantization = config.quantization;
    layout.capPadded = 0;
    for (size_t g = 0; g < windows.size(); ++g)
    {
        int64_t const window = windows[g];
        int64_t pagesPerSequence = fullPages;
        if (window > 0)
        {
            pagesPerSequence = std::min(fullPages, (window - 1 + stepTokens + tokensPerPage - 1) / tokensPerPage + 1);
        }
        std::string const where = windows.size() == 1 && config.numPagesPerGroup.empty()
            ? std::string("numPages")
            : fmt::format("numPagesPerGroup[{}]", g);
        int64_t const minPages = int64_t{config.maxBatchSize} * pagesPerSequence;
        if (minPages > kMAX_NUM_PAGES)
        {
            throw InvalidConfigError(
                fmt::format("KVCacheConfig: the minimum page count of page group {} (sliding "
                            "window {}): maxBatchSize ({}) x pagesPerSequence ({}) = {} exceeds {}, "
                            "the largest count whose V page ids fit in int32",
                    g, window, config.maxBatchSize, pagesPerSequence, minPages, kMAX_NUM_PAGES));
        }
        int32_t const asked = config.numPagesPerGroup.empty() ? config.numPages : config.numPagesPerGroup[g];
        if (asked < 0 || asked > kMAX_NUM_PAGES)
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.{} is {}; it must be in [0, {}] so that 2 * numPages "
                                                 "fits in int32",
                where, asked, kMAX_NUM_PAGES));
        }
        if (asked != 0 && asked < minPages)
        {
            throw InvalidConfigError(fmt::format("KVCacheConfig.{} is {}; it must be 0 or at least the minimum {} "
                                                 "(maxBatchSize {} x {} pages per sequence)",
                where, asked, minPages, config.maxBatchSize, pagesPerSequence));
        }
        KVPageGroupLayout group;
        group.slidingWindow = static_cast<int32_t>(window);
        group.pagesPerSequence = static_cast<int32_t>(pagesPerSequence);
        group.slotTokens = static_cast<int32_t>(pagesPerSequence * tokensPerPage);
        group.minPages = static_cast<int32_t>(minPages);
        group.numPages = asked == 0 ? group.minPages : asked;
        layout.capPadded = std::max(layout.capPadded, group.slotTokens);
        if (config.layerConfigs.empty())
        {
            break; // the scalar fields only
        }
        layout.groups.push_back(group);
    }
    KVPageGroupLayout const first = layout.groups.empty()
        ? KVPageGroupLayout{0, static_cast<int32_t>(fullPages), static_cast<int32_t>(capPadded),
            static_cast<int32_t>(config.maxBatchSize * fullPages),
            config.numPages == 0 ? static_cast<int32_t>(config.maxBatchSize * fullPages) : config.numPages, {}, 0, 0}
        : layout.groups.front();
    layout.pagesPerSlot = first.pagesPerSequence;
    layout.minPages = first.minPages;
    layout.numPages = first.numPages;
    if (layout.groups.empty())
    {
        layout.capPadded = static_cast<int32_t>(capPadded);
    }

    layout.layers.reserve(config.layerConfigs.size());
    for (size_t i = 0; i < config.layerConfigs.size(); ++i)
    {
        KVLayerConfig const& layerConfig = config.layerConfigs[i];
        std::string const where = fmt::format("layer {} ", i);
        auto const groupIndex = static_cast<int32_t>(
            std::lower_bound(windows.begin(), windows.end(), layerConfig.slidingWindow) - windows.begin());
        KVPageGroupLayout& group = layout.groups[static_cast<size_t>(groupIndex)];
        KVLayerLayout layer;
        layer.numKVHeads = layerConfig.numKVHeads;
        layer.headDim = layerConfig.headDim;
        layer.kind = layerConfig.kind;
        layer.slidingWindow = layerConfig.slidingWindow;
        layer.group = groupIndex;
        layer.numHalves = layerConfig.kind == KVLayerKind::kLATENT ? 1 : 2;
        layer.slotTokens = group.slotTokens;
        layer.numPages = group.numPages;
        // NVFP4 stores two values a byte (headDim is a multiple of 16, so even).
        layer.storedDim = config.quantization == KVQuantization::kNVFP4 ? layerConfig.headDim / 2 : layerConfig.headDim;
        int64_t const tokenHeads = int64_t{tokensPerPage} * layerConfig.numKVHeads; // < 2^41: no overflow
        layer.pageElems = checkedMul(tokenHeads, layer.storedDim, where + "page elements");
        layer.pageBytes = checkedMul(layer.pageElems, layout.elementBytes, where + "page bytes");
        layer.halfElems = checkedMul(group.numPages, layer.pageElems, where + "elements per half");
        layer.layerBytes = checkedMul(
            checkedMul(layer.numHalves, layer.halfElems, where + "elements"), layout.elementBytes, where + "bytes");
        // Scales live in an allocation of their own (docs/layout.md, "Quantized pages"): no padding, so a page id's
        // bytes times the pages are the cache's bytes exactly and the budget maths stay closed form.
        layer.scalePageBytes = checkedMul(tokenHeads,
            detail::scaleBytesPerTokenHead(config.quantization, layerConfig.headDim), where + "scale page bytes");
        layer.scaleBytes = checkedMul(checkedMul(layer.numHalves, group.numPages, where + "scale pages"),
            layer.scalePageBytes, where + "scale bytes");
        int64_t const layerPageBytes = checkedMul(layer.numHalves,
            checkedAdd(layer.pageBytes, layer.scalePageBytes, where + "page and scale bytes"), where + "page bytes");
        int64_t const allocatedBytes = checkedAdd(layer.layerBytes, layer.scaleBytes, where + "data and scale bytes");
        group.layers.push_back(static_cast<int32_t>(i));
        group.bytesPerPage = checkedAdd(group.bytesPerPage, layerPageBytes, "bytes per page");
        group.cacheBytes = checkedAdd(group.cacheBytes, allocatedBytes, "group bytes");
        layout.cacheBytes = checkedAdd(layout.cacheBytes, allocatedBytes, "total cache bytes");
        layout.bytesPerPage = checkedAdd(layout.bytesPerPage, layerPageBytes, "bytes per page");
        layout.layers.push_back(layer);
    }
    detail::addStateLayers(config, layout);
    return layout;
}

namespace
{

//! Checks a budget and returns the layout of `config` at its minimum pages, whatever page counts it asks for.
KVCacheLayout layoutForBudget(char const* what, KVCacheConfig const& config, int64_t budgetBytes)
{
    if (budgetBytes < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: budgetBytes is {}; it must be >= 0", what, budgetBytes));
    }
    KVCacheConfig minimal = config;
    minimal.numPages = 0;
    minimal.numPagesPerGroup.clear();
    return computeLayout(minimal);
}

} // namespace

int64_t maxPagesForBudget(KVCacheConfig const& config, int64_t budgetBytes)
{
    KVCacheLayout const layout = layoutForBudget("maxPagesForBudget", config, budgetBytes);
    if (layout.groups.size() > 1)
    {
        throw InvalidConfigError(fmt::format("maxPagesForBudget: the config has {} page groups, which need a page "
                                             "count each; use splitBudget",
            layout.groups.size()));
    }
    if (layout.bytesPerPage == 0)
    {
        return kMAX_NUM_PAGES;
    }
    int64_t const pageBudget = std::max<int64_t>(budgetBytes - layout.stateBytes, 0);
    return std::min<int64_t>(pageBudget / layout.bytesPerPage, kMAX_NUM_PAGES);
}

BudgetSplit splitBudget(KVCacheConfig const& config, int64_t budgetBytes)
{
    KVCacheLayout const layout = layoutForBudget("splitBudget", config, budgetBytes);
    // One full-length sequence takes pagesPerSequence pages of every group.
    int64_t bytesPerSequence = 0;
    int64_t sequences = std::numeric_limits<int64_t>::max();
    for (KVPageGroupLayout const& group : layout.groups)
    {
        bytesPerSequence = checkedAdd(bytesPerSequence,
            checkedMul(group.pagesPerSequence, group.bytesPerPage, "bytes per sequence"), "bytes per sequence");
        sequences = std::min<int64_t>(sequences, kMAX_NUM_PAGES / group.pagesPerSequence);
    }
    BudgetSplit split;
    split.stateBytes = layout.stateBytes;
    int64_t const pageBudget = std::max<int64_t>(budgetBytes - layout.stateBytes, 0);
    if (bytesPerSequence > 0)
    {
        split.sequences = std::min(sequences, pageBudget / bytesPerSequence);
    }
    for (KVPageGroupLayout const& group : layout.groups)
    {
        split.numPagesPerGroup.push_back(split.sequences * group.pagesPerSequence);
    }
    // At most the page budget plus the state bytes, both below 2^63: no overflow.
    split.bytes = split.sequences * bytesPerSequence + layout.stateBytes;
    return split;
}

} // namespace kvcache::rt
