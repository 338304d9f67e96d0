#include "page_ops_models.h"

#include "kvcache/core/kv_cache_layout.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/config_builder.h"

namespace kvcache::bench
{
namespace
{

constexpr int32_t kNUM_LAYERS = 32;
//! The uniform models' layer shape (8 KV heads of 128), the first of the mixed model's four.
constexpr rt::KVLayerConfig kUNIFORM_LAYER{8, 128};
constexpr uint64_t kPAGE_SEED = 20240611;

//! A gpt-oss-like hybrid model: 24 layers of 8 KV heads of 64, bfloat16, alternating a 128-token sliding window with
//! full attention, so two page groups of 12 layers; `group` picks the one its cases copy.
Model groupedModel(char const* name, int32_t group)
{
    Model model{name, rt::DataType::kBF16, {}, group};
    for (int32_t i = 0; i < 24; ++i)
    {
        model.layers.push_back({8, 64, i % 2 == 0 ? 128 : 0, rt::KVLayerKind::kKV});
    }
    return model;
}

} // namespace

Model const& uniformModel()
{
    static Model const model{
        "fp16_uniform", rt::DataType::kHALF, std::vector<rt::KVLayerConfig>(kNUM_LAYERS, kUNIFORM_LAYER)};
    return model;
}

Model const& fp8Model()
{
    static Model const model{
        "fp8_uniform", rt::DataType::kFP8_E4M3, std::vector<rt::KVLayerConfig>(kNUM_LAYERS, kUNIFORM_LAYER)};
    return model;
}

Model const& fp8PerTokenHeadModel()
{
    static Model const model{"fp8_per_token_head_uniform", rt::DataType::kFP8_E4M3,
        std::vector<rt::KVLayerConfig>(kNUM_LAYERS, kUNIFORM_LAYER), -1, rt::KVQuantization::kFP8_PER_TOKEN_HEAD};
    return model;
}

Model const& nvfp4Model()
{
    static Model const model{"nvfp4_uniform", rt::DataType::kUINT8,
        std::vector<rt::KVLayerConfig>(kNUM_LAYERS, kUNIFORM_LAYER), -1, rt::KVQuantization::kNVFP4};
    return model;
}

Model const& mixedModel()
{
    static Model const model = []
    {
        std::vector<rt::KVLayerConfig> const shapes{kUNIFORM_LAYER, {4, 64}, {2, 256}, {1, 80}};
        Model result{"fp16_mixed", rt::DataType::kHALF, {}};
        for (int32_t i = 0; i < kNUM_LAYERS; ++i)
        {
            result.layers.push_back(shapes[static_cast<size_t>(i) % shapes.size()]);
        }
        return result;
    }();
    return model;
}

Model const& groupedFullModel()
{
    static Model const model = groupedModel("bf16_grouped_full", 0);
    return model;
}

Model const& groupedWindowModel()
{
    static Model const model = groupedModel("bf16_grouped_window", 1);
    return model;
}

rt::KVCacheManager const& cacheOf(Harness& harness, Model const& model)
{
    rt::KVCacheConfig config = test::ConfigBuilder(model.layers)
                                   .maxBatchSize(1)
                                   .maxSequenceLength(rt::kTOKENS_PER_PAGE)
                                   .dataType(model.type)
                                   .quantization(model.quantization)
                                   .build();
    int32_t const groups = static_cast<int32_t>(rt::computeLayout(config).groups.size());
    if (groups > 1)
    {
        config.numPagesPerGroup.assign(static_cast<size_t>(groups), kPOOL_PAGES);
    }
    else
    {
        config.numPages = kPOOL_PAGES;
    }
    return harness.cache(model.name, config);
}

int32_t groupOf(Model const& model)
{
    return std::max(model.group, 0);
}

int32_t poolPagesOf(rt::KVCacheManager const& cache, Model const& model)
{
    return cache.group(groupOf(model)).numPages;
}

std::vector<int32_t> scatteredPages(int32_t count, int32_t numPages)
{
    std::vector<int32_t> ids(static_cast<size_t>(numPages));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 generator(kPAGE_SEED + static_cast<uint64_t>(count));
    std::shuffle(ids.begin(), ids.end(), generator);
    ids.resize(static_cast<size_t>(count));
    return ids;
}

std::vector<rt::PageCopy> scatteredPairs(int32_t count, int32_t numPages)
{
    std::vector<int32_t> const ids = scatteredPages(2 * count, numPages);
    std::vector<rt::PageCopy> pairs;
    for (size_t i = 0; i < static_cast<size_t>(count); ++i)
    {
        pairs.push_back({ids[i], ids[i + static_cast<size_t>(count)]});
    }
    return pairs;
}

std::vector<rt::PageCopy> pairsInOneRun(int32_t count)
{
    std::vector<rt::PageCopy> pairs;
    for (int32_t i = 0; i < count; ++i)
    {
        pairs.push_back({i, count + i});
    }
    return pairs;
}

std::vector<rt::PageCopy> pairsInRuns(int32_t count, int32_t runLength, int32_t numPages)
{
    int32_t const runsPerSide = (count + runLength - 1) / runLength;
    if (2 * runsPerSide * runLength > numPages)
    {
        throw std::runtime_error(
            "the pool is too small for " + std::to_string(count) + " pairs in runs of " + std::to_string(runLength));
    }
    std::vector<int32_t> const runs = scatteredPages(2 * runsPerSide, numPages / runLength);
    std::vector<rt::PageCopy> pairs;
    for (int32_t i = 0; i < count; ++i)
    {
        int32_t const run = i / runLength;
        int32_t const offset = i % runLength;
        pairs.push_back({runs[static_cast<size_t>(run)] * runLength + offset,
            runs[static_cast<size_t>(runsPerSide + run)] * runLength + offset});
    }
    return pairs;
}

} // namespace kvcache::bench
