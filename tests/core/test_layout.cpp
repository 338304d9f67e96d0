#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/layer_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/layout_model.h"

namespace kvcache::rt
{
namespace
{

constexpr int64_t kINT32_LIMIT = std::numeric_limits<int32_t>::max();
constexpr int64_t kINT64_LIMIT = std::numeric_limits<int64_t>::max();

static_assert(std::is_base_of_v<std::runtime_error, InvalidConfigError>);

//! Returns the worked example: 3 slots of 100 tokens in pages of 32, float16, layers (2, 64) and (8, 128).
test::ConfigBuilder workedExample()
{
    return test::ConfigBuilder({{2, 64}, {8, 128}}).maxBatchSize(3).maxSequenceLength(100).tokensPerPage(32);
}

//! Returns one slot of one token in pages of one token, one layer of one int8 element: 2 bytes a page id.
test::ConfigBuilder oneInt8Element()
{
    return test::ConfigBuilder({{1, 1}}).maxSequenceLength(1).tokensPerPage(1).dataType(DataType::kINT8);
}

//! Returns a config without attention layers.
test::ConfigBuilder noLayers()
{
    return test::ConfigBuilder(std::vector<KVLayerConfig>{});
}

//! The KV cache element types, for random configs.
constexpr std::array<DataType, 7> kKV_TYPES = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kFP8_E4M3,
    DataType::kFP8_E5M2, DataType::kINT8, DataType::kUINT8};

void expectLayoutMatchesModel(KVCacheConfig const& config, KVCacheLayout const& layout)
{
    test::LayoutModel const model = test::modelLayout(config);
    EXPECT_EQ(layout.tokensPerPage, config.tokensPerPage);
    EXPECT_EQ(layout.capPadded, model.capPadded);
    EXPECT_EQ(layout.pagesPerSlot, model.pagesPerSlot);
    EXPECT_EQ(layout.minPages, model.minPages);
    EXPECT_EQ(layout.numPages, model.numPages);
    EXPECT_EQ(layout.elementBytes, test::elementBytesByHand(config.kvCacheType));
    ASSERT_EQ(layout.layers.size(), model.layers.size());
    for (size_t i = 0; i < model.layers.size(); ++i)
    {
        SCOPED_TRACE("layer " + std::to_string(i));
        EXPECT_EQ(layout.layers[i].numKVHeads, config.layerConfigs[i].numKVHeads);
        EXPECT_EQ(layout.layers[i].headDim, config.layerConfigs[i].headDim);
        EXPECT_EQ(layout.layers[i].pageElems, model.layers[i].pageElems);
        EXPECT_EQ(layout.layers[i].pageBytes, model.layers[i].pageBytes);
        EXPECT_EQ(layout.layers[i].halfElems, model.layers[i].halfElems);
        EXPECT_EQ(layout.layers[i].layerBytes, model.layers[i].layerBytes);
    }
    EXPECT_EQ(layout.cacheBytes, model.cacheBytes);
    EXPECT_EQ(layout.bytesPerPage, model.bytesPerPage);
    // Every page id costs the same across the cache.
    EXPECT_EQ(layout.cacheBytes, model.numPages * model.bytesPerPage);
}

//! A power of two in [1, 1024], three times in four from the common 16..128.
int32_t randomPageSize(std::mt19937& rng)
{
    bool const common = std::uniform_int_distribution<int32_t>(0, 3)(rng) != 0;
    int32_t const shift =
        common ? std::uniform_int_distribution<int32_t>(4, 7)(rng) : std::uniform_int_distribution<int32_t>(0, 10)(rng);
    return int32_t{1} << shift;
}

struct RandomLimits
{
    int32_t maxLayers;
    int32_t maxHeads;
    int32_t maxHeadDim;
    int32_t maxBatch;
    int32_t maxSequence;
    int32_t maxPageShift;
};

//! A random valid config whose maxSequenceLength is not a multiple of a page (unless pages are one token); with
//! `retainPages`, numPages is above the minimum.
KVCacheConfig randomConfig(std::mt19937& rng, RandomLimits const& limits, bool retainPages)
{
    auto const pick = [&rng](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
    int32_t const pageSize =
        limits.maxPageShift >= 10 ? randomPageSize(rng) : int32_t{1} << pick(0, limits.maxPageShift);
    std::vector<KVLayerConfig> layers(static_cast<size_t>(pick(1, limits.maxLayers)));
    for (KVLayerConfig& layer : layers)
    {
        layer.numKVHeads = pick(1, limits.maxHeads);
        layer.headDim = pick(1, limits.maxHeadDim);
    }
    int32_t maxSequenceLength = pick(1, limits.maxSequence);
    if (pageSize > 1 && maxSequenceLength % pageSize == 0)
    {
        // A multiple of the page size is at least one page, so this stays positive.
        maxSequenceLength -= pick(1, pageSize - 1);
    }
    int32_t const batch = pick(1, limits.maxBatch);
    DataType const type = kKV_TYPES[static_cast<size_t>(pick(0, static_cast<int32_t>(kKV_TYPES.size()) - 1))];
    test::ConfigBuilder builder(layers);
    builder.maxBatchSize(batch).maxSequenceLength(maxSequenceLength).tokensPerPage(pageSize).dataType(type);
    KVCacheConfig config = builder.build();
    if (retainPages)
    {
        int32_t const pagesPerSlot = (maxSequenceLength + pageSize - 1) / pageSize;
        config.numPages = batch * pagesPerSlot + pick(1, batch * pagesPerSlot + 3);
    }
    return config;
}

// ---------------------------------------------------------------------------------------------------------------
// Layout maths

//! One layer's sizes worked out by hand: elements and bytes of a page of one half, elements of a half, bytes of both.
struct SizesByHand
{
    int64_t pageElems;
    int64_t pageBytes;
    int64_t halfElems;
    int64_t layerBytes;
};

//! Page counts worked out by hand.
struct PagesByHand
{
    int64_t capPadded;
    int64_t pagesPerSlot;
    int64_t minPages;
    int64_t numPages;
};

void expectLayoutByHand(KVCacheLayout const& layout, PagesByHand const& pages, std::vector<SizesByHand> const& layers)
{
    EXPECT_EQ(layout.capPadded, pages.capPadded);
    EXPECT_EQ(layout.pagesPerSlot, pages.pagesPerSlot);
    EXPECT_EQ(layout.minPages, pages.minPages);
    EXPECT_EQ(layout.numPages, pages.numPages);
    ASSERT_EQ(layout.layers.size(), layers.size());
    for (size_t i = 0; i < layers.size(); ++i)
    {
        SCOPED_TRACE("layer " + std::to_string(i));
        EXPECT_EQ(layout.layers[i].pageElems, layers[i].pageElems);
        EXPECT_EQ(layout.layers[i].pageBytes, layers[i].pageBytes);
        EXPECT_EQ(layout.layers[i].halfElems, layers[i].halfElems);
        EXPECT_EQ(layout.layers[i].layerBytes, layers[i].layerBytes);
    }
}

TEST(Layout, WorkedExampleByHand)
{
    // 3 slots of 100 tokens in pages of 32: 4 pages (128 tokens) per slot, 12 pages.
    // Layer 0: 32 * 2 * 64 = 4096 elements per page, 8192 bytes in fp16; 12 pages: 49152 elements, 196608 bytes.
    // Layer 1: 32 * 8 * 128 = 32768 elements per page, 65536 bytes; 12 pages: 393216 elements, 1572864 bytes.
    KVCacheConfig const config = workedExample().build();
    KVCacheLayout const layout = computeLayout(config);
    EXPECT_EQ(layout.tokensPerPage, 32);
    EXPECT_EQ(layout.elementBytes, 2);
    expectLayoutByHand(layout, {128, 4, 12, 12}, {{4096, 8192, 49152, 196608}, {32768, 65536, 393216, 1572864}});
    EXPECT_EQ(layout.cacheBytes, 196608 + 1572864);
    EXPECT_EQ(layout.bytesPerPage, 2 * (8192 + 65536));
}

TEST(Layout, DefaultPageSizeAndRetainedPagesByHand)
{
    // Default 128-token pages: 300 tokens need 3 pages (384 tokens); 2 slots need 6, 10 are retained.
    // fp32, 4 heads of 16: 128 * 64 = 8192 elements per page, 32768 bytes; 10 pages: 81920 elements, 655360 bytes.
    test::ConfigBuilder builder({{4, 16}});
    builder.maxBatchSize(2).maxSequenceLength(300).dataType(DataType::kFLOAT);
    KVCacheConfig const config = builder.numPages(10).build();
    EXPECT_EQ(KVCacheConfig{}.tokensPerPage, 128);
    KVCacheLayout const layout = KVCacheManager::validate(config);
    expectLayoutByHand(layout, {384, 3, 6, 10}, {{8192, 32768, 81920, 655360}});
    EXPECT_EQ(layout.cacheBytes, 655360);
    EXPECT_EQ(layout.bytesPerPage, 65536);
}

TEST(Layout, ExactMultipleAndShortSequences)
{
    // A sequence that fills its pages exactly is not padded; one shorter than a page still takes a page.
    KVCacheLayout const exact =
        computeLayout(test::ConfigBuilder({{1, 8}}).maxBatchSize(2).maxSequenceLength(256).tokensPerPage(64).build());
    EXPECT_EQ(exact.capPadded, 256);
    EXPECT_EQ(exact.pagesPerSlot, 4);
    EXPECT_EQ(exact.minPages, 8);
    KVCacheLayout const shortSequence =
        computeLayout(test::ConfigBuilder({{1, 8}}).maxBatchSize(5).maxSequenceLength(3).tokensPerPage(1024).build());
    EXPECT_EQ(shortSequence.capPadded, 1024);
    EXPECT_EQ(shortSequence.pagesPerSlot, 1);
    EXPECT_EQ(shortSequence.minPages, 5);
    KVCacheLayout const onePerPage =
        computeLayout(test::ConfigBuilder({{1, 8}}).maxBatchSize(3).maxSequenceLength(7).tokensPerPage(1).build());
    EXPECT_EQ(onePerPage.capPadded, 7);
    EXPECT_EQ(onePerPage.minPages, 21);
}

TEST(Layout, ZeroLayersIsValid)
{
    KVCacheConfig const config = noLayers().maxBatchSize(4).maxSequenceLength(100).tokensPerPage(16).build();
    KVCacheLayout const layout = computeLayout(config);
    EXPECT_TRUE(layout.layers.empty());
    EXPECT_EQ(layout.cacheBytes, 0);
    EXPECT_EQ(layout.bytesPerPage, 0);
    EXPECT_EQ(layout.capPadded, 112);
    EXPECT_EQ(layout.minPages, 28);
    expectLayoutMatchesModel(config, layout);
}

TEST(Layout, LargestPageCountIsAccepted)
{
    // 2 * numPages must fit in int32: 2 * 1073741823 = 2147483646 does, 2 * 1073741824 does not.
    static_assert(2 * int64_t{kMAX_NUM_PAGES} <= kINT32_LIMIT);
    static_assert(2 * (int64_t{kMAX_NUM_PAGES} + 1) > kINT32_LIMIT);
    KVCacheConfig const config = oneInt8Element().numPages(kMAX_NUM_PAGES).build();
    KVCacheLayout const layout = computeLayout(config);
    EXPECT_EQ(layout.numPages, 1073741823);
    EXPECT_EQ(layout.cacheBytes, 2 * int64_t{1073741823});
    expectLayoutMatchesModel(config, layout);
}

TEST(Layout, RandomConfigsMatchBruteForceModel)
{
    std::mt19937 rng(20240611U);
    RandomLimits const limits{6, 16, 256, 16, 4096, 10};
    int32_t retained = 0;
    for (int32_t trial = 0; trial < 400; ++trial)
    {
        bool const retainPages = trial % 3 == 0;
        KVCacheConfig const config = randomConfig(rng, limits, retainPages);
        SCOPED_TRACE("trial " + std::to_string(trial) + ": batch " + std::to_string(config.maxBatchSize) + ", seq "
            + std::to_string(config.maxSequenceLength) + ", page " + std::to_string(config.tokensPerPage)
            + ", numPages " + std::to_string(config.numPages));
        KVCacheLayout const layout = computeLayout(config);
        expectLayoutMatchesModel(config, layout);
        EXPECT_EQ(KVCacheManager::validate(config).cacheBytes, layout.cacheBytes);
        if (layout.numPages > layout.minPages)
        {
            ++retained;
        }
    }
    EXPECT_GT(retained, 100);
}

// ---------------------------------------------------------------------------------------------------------------
// Slot view against pool view, element by element

//! Checks every element of every layer's slot view: its offset through the separate K/V views equals the pool
//! offset through the identity page table, offsets are distinct and inside the layer, and the combined slot view's
//! implied V offset agrees with the pool exactly when no pages are retained.
void checkSlotViewAgainstPool(KVCacheConfig const& config)
{
    KVCacheLayout const layout = computeLayout(config);
    test::LayoutModel const model = test::modelLayout(config);
    ASSERT_EQ(layout.capPadded, model.capPadded);
    ASSERT_EQ(layout.pagesPerSlot, model.pagesPerSlot);
    int64_t const batch = config.maxBatchSize;
    int64_t const cap = model.capPadded;
    int64_t const pageSize = config.tokensPerPage;
    int64_t const pagesPerSlot = model.pagesPerSlot;
    int64_t const e = test::elementBytesByHand(config.kvCacheType);
    bool const retained = model.numPages > model.minPages;
    for (size_t i = 0; i < config.layerConfigs.size(); ++i)
    {
        SCOPED_TRACE("layer " + std::to_string(i));
        int64_t const heads = config.layerConfigs[i].numKVHeads;
        int64_t const dim = config.layerConfigs[i].headDim;
        int64_t const halfElems = layout.layers[i].halfElems;
        int64_t const layerBytes = layout.layers[i].layerBytes;
        ASSERT_EQ(halfElems, model.layers[i].halfElems);
        ASSERT_EQ(layerBytes, model.layers[i].layerBytes);
        int64_t const combinedVOffset = batch * cap * heads * dim;
        EXPECT_EQ(combinedVOffset == halfElems, !retained);

        std::vector<bool> seen(static_cast<size_t>(layerBytes / e), false);
        int64_t visited = 0;
        int64_t mismatches = 0;
        int64_t combinedAgrees = 0;
        for (int64_t kv = 0; kv < 2; ++kv)
        {
            for (int64_t b = 0; b < batch; ++b)
            {
                for (int64_t s = 0; s < cap; ++s)
                {
                    int64_t const page = b * pagesPerSlot + s / pageSize;
                    int64_t const t = s % pageSize;
                    for (int64_t h = 0; h < heads; ++h)
                    {
                        for (int64_t d = 0; d < dim; ++d)
                        {
                            int64_t const token = ((b * cap + s) * heads + h) * dim + d;
                            int64_t const slotByte = (kv * halfElems + token) * e;
                            int64_t const poolByte =
                                (kv * halfElems + ((page * pageSize + t) * heads + h) * dim + d) * e;
                            int64_t const combinedByte = (kv * combinedVOffset + token) * e;
                            mismatches += slotByte != poolByte ? 1 : 0;
                            combinedAgrees += combinedByte == poolByte ? 1 : 0;
                            ++visited;
                            if (slotByte < 0 || slotByte + e > layerBytes || slotByte % e != 0)
                            {
                                ADD_FAILURE() << "offset " << slotByte << " outside [0, " << layerBytes << ")";
                                return;
                            }
                            auto const index = static_cast<size_t>(slotByte / e);
                            if (seen[index])
                            {
                                ADD_FAILURE() << "offset " << slotByte << " reached twice";
                                return;
                            }
                            seen[index] = true;
                        }
                    }
                }
            }
        }
        EXPECT_EQ(mismatches, 0);
        int64_t const slotElems = batch * cap * heads * dim;
        EXPECT_EQ(visited, 2 * slotElems);
        if (retained)
        {
            // K agrees (same base), every V element of the combined view lands elsewhere, inside the K pool.
            EXPECT_EQ(combinedAgrees, slotElems);
            EXPECT_LT(combinedVOffset, halfElems);
        }
        else
        {
            // Without retained pages the slot view covers the whole buffer and the combined view is the pool.
            EXPECT_EQ(combinedAgrees, 2 * slotElems);
            EXPECT_EQ(visited * e, layerBytes);
        }
    }
}

TEST(SlotView, SmallHandPickedConfigsAgreeWithPool)
{
    checkSlotViewAgainstPool(test::ConfigBuilder({{2, 3}}).maxBatchSize(3).maxSequenceLength(10).tokensPerPage(4));
    checkSlotViewAgainstPool(test::ConfigBuilder({{1, 2}, {3, 1}})
                                 .maxBatchSize(2)
                                 .maxSequenceLength(5)
                                 .tokensPerPage(1)
                                 .dataType(DataType::kFLOAT));
    checkSlotViewAgainstPool(
        test::ConfigBuilder({{2, 2}}).maxSequenceLength(9).tokensPerPage(8).dataType(DataType::kFP8_E4M3));
    checkSlotViewAgainstPool(test::ConfigBuilder({{1, 4}, {2, 8}, {4, 2}})
                                 .maxBatchSize(4)
                                 .maxSequenceLength(16)
                                 .tokensPerPage(16)
                                 .dataType(DataType::kBF16));
}

TEST(SlotView, RetainedPagesKeepSeparateViewsButBreakCombined)
{
    checkSlotViewAgainstPool(
        test::ConfigBuilder({{2, 3}}).maxBatchSize(3).maxSequenceLength(10).tokensPerPage(4).numPages(10));
    checkSlotViewAgainstPool(test::ConfigBuilder({{1, 1}, {2, 5}})
                                 .maxBatchSize(2)
                                 .maxSequenceLength(7)
                                 .tokensPerPage(2)
                                 .dataType(DataType::kUINT8)
                                 .numPages(9));
    checkSlotViewAgainstPool(oneInt8Element().numPages(2));
}

TEST(SlotView, RandomSmallConfigsAgreeWithPool)
{
    std::mt19937 rng(7U);
    RandomLimits const limits{3, 3, 5, 4, 40, 3};
    for (int32_t trial = 0; trial < 60; ++trial)
    {
        KVCacheConfig const config = randomConfig(rng, limits, trial % 2 == 1);
        SCOPED_TRACE("trial " + std::to_string(trial));
        checkSlotViewAgainstPool(config);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Validation: each rule throws InvalidConfigError whose message names the field and the offending value.

//! True when `message` holds `value` as a whole number (not as part of a longer one).
bool mentionsNumber(std::string const& message, int64_t value)
{
    std::string const text = std::to_string(value);
    auto const isDigit = [](char c) { return c >= '0' && c <= '9'; };
    for (size_t pos = message.find(text); pos != std::string::npos; pos = message.find(text, pos + 1))
    {
        bool const digitBefore = pos > 0 && (isDigit(message[pos - 1]) || (value >= 0 && message[pos - 1] == '-'));
        bool const digitAfter = pos + text.size() < message.size() && isDigit(message[pos + text.size()]);
        if (!digitBefore && !digitAfter)
        {
            return true;
        }
    }
    return false;
}

//! Expects both computeLayout and KVCacheManager::validate to reject `config` with InvalidConfigError whose
//! message holds every word of `words` and every number of `numbers`.
void expectRejected(
    KVCacheConfig const& config, std::vector<std::string> const& words, std::vector<int64_t> const& numbers)
{
    for (bool const throughManager : {false, true})
    {
        SCOPED_TRACE(throughManager ? "KVCacheManager::validate" : "computeLayout");
        std::string message;
        EXPECT_TRUE(test::throwsNaming<InvalidConfigError>([&]
            { static_cast<void>(throughManager ? KVCacheManager::validate(config) : computeLayout(config)); },
            words, &message));
        for (int64_t const number : numbers)
        {
            EXPECT_TRUE(mentionsNumber(message, number)) << "message lacks " << number << ": " << message;
        }
    }
}

//! Returns a valid config of `type` (which may make it invalid).
KVCacheConfig validConfigOf(DataType type)
{
    test::ConfigBuilder builder({{8, 128}, {2, 64}, {4, 96}});
    return builder.maxBatchSize(4).maxSequenceLength(1000).tokensPerPage(64).dataType(type).build();
}

KVCacheConfig validConfig()
{
    return validConfigOf(DataType::kHALF);
}

//! Expects validConfig(), changed by `change(config, value)`, to be rejected for each of `values` with a message that
//! holds every word of `words`, every number of `numbers` and the value.
template <typename Change>
void expectRejectedFor(std::initializer_list<int32_t> values, Change const& change,
    std::vector<std::string> const& words, std::vector<int64_t> numbers = {})
{
    for (int32_t const value : values)
    {
        SCOPED_TRACE("value " + std::to_string(value));
        KVCacheConfig config = validConfig();
        change(config, value);
        numbers.push_back(value);
        expectRejected(config, words, numbers);
        numbers.pop_back();
    }
}

void setTokensPerPage(KVCacheConfig& config, int32_t value)
{
    config.tokensPerPage = value;
}

TEST(Validation, BaseConfigIsValid)
{
    EXPECT_NO_THROW(static_cast<void>(computeLayout(validConfig())));
}

TEST(Validation, InvalidConfigErrorIsARuntimeError)
{
    KVCacheConfig config = validConfig();
    config.maxBatchSize = 0;
    EXPECT_THROW(static_cast<void>(computeLayout(config)), std::runtime_error);
}

TEST(Validation, RejectsInt32DataType)
{
    expectRejected(validConfigOf(DataType::kINT32), {"kvCacheType", "int32"}, {});
}

TEST(Validation, RejectsInt64DataType)
{
    expectRejected(validConfigOf(DataType::kINT64), {"kvCacheType", "int64"}, {});
}

TEST(Validation, RejectsDataTypeOutsideTheEnumeration)
{
    expectRejected(validConfigOf(static_cast<DataType>(99)), {"kvCacheType"}, {99});
}

TEST(Validation, RejectsNegativeLayerCount)
{
    expectRejectedFor(
        {-3}, [](KVCacheConfig& config, int32_t value) { config.numAttentionLayers = value; }, {"numAttentionLayers"});
}

TEST(Validation, RejectsNonPositiveBatch)
{
    expectRejectedFor(
        {0, -7}, [](KVCacheConfig& config, int32_t value) { config.maxBatchSize = value; }, {"maxBatchSize"});
}

TEST(Validation, RejectsNonPositiveSequenceLength)
{
    expectRejectedFor({0, -12}, [](KVCacheConfig& config, int32_t value) { config.maxSequenceLength = value; },
        {"maxSequenceLength"});
}

TEST(Validation, RejectsLayerConfigCountMismatch)
{
    // validConfig has 3 layer configs.
    expectRejectedFor({2, 5}, [](KVCacheConfig& config, int32_t value) { config.numAttentionLayers = value; },
        {"layerConfigs", "numAttentionLayers"}, {3});
}

TEST(Validation, RejectsNonPositiveHeadsNamingTheLayer)
{
    expectRejectedFor({0, -5}, [](KVCacheConfig& config, int32_t value) { config.layerConfigs[2].numKVHeads = value; },
        {"numKVHeads", "[2]"});
}

TEST(Validation, RejectsNonPositiveHeadDimNamingTheLayer)
{
    expectRejectedFor({0, -64}, [](KVCacheConfig& config, int32_t value) { config.layerConfigs[1].headDim = value; },
        {"headDim", "[1]"});
}

TEST(Validation, RejectsPageSizeThatIsNotAPowerOfTwo)
{
    expectRejectedFor({3, 96, 100, 1000}, setTokensPerPage, {"tokensPerPage"});
}

TEST(Validation, RejectsZeroOrNegativePageSize)
{
    expectRejectedFor({0, -16}, setTokensPerPage, {"tokensPerPage"});
}

TEST(Validation, RejectsPageSizeAboveLimit)
{
    expectRejectedFor({2048, 1 << 20}, setTokensPerPage, {"tokensPerPage"}, {1024});
    KVCacheConfig config = validConfig();
    config.tokensPerPage = 1024;
    EXPECT_NO_THROW(static_cast<void>(computeLayout(config)));
}

TEST(Validation, RejectsFewerPagesThanTheMinimum)
{
    // 4 slots of 1000 tokens in pages of 64: 16 pages per slot, 64 pages at least.
    expectRejectedFor(
        {5, 63}, [](KVCacheConfig& config, int32_t value) { config.numPages = value; }, {"numPages"}, {64});
    KVCacheConfig config = validConfig();
    config.numPages = 64;
    EXPECT_EQ(computeLayout(config).numPages, 64);
}

TEST(Validation, RejectsPageCountWhoseVIdsOverflowInt32)
{
    KVCacheConfig config = oneInt8Element().build();
    config.numPages = kMAX_NUM_PAGES + 1;
    expectRejected(config, {"numPages"}, {1073741824});
    config.numPages = std::numeric_limits<int32_t>::max();
    expectRejected(config, {"numPages"}, {kINT32_LIMIT});
}

TEST(Validation, RejectsMinimumPageCountWhoseVIdsOverflowInt32)
{
    // 2^20 slots of 2^11 one-token pages need 2^31 pages.
    KVCacheConfig const config = oneInt8Element().maxBatchSize(1 << 20).maxSequenceLength(1 << 11).build();
    expectRejected(config, {"maxBatchSize"}, {1 << 20});
}

TEST(Validation, RejectsSizesOverflowing64Bits)
{
    // Layer 1 has 2^15 * 2^15 * 2^10 = 2^40 elements per page; times 1073741823 pages leaves int64.
    test::ConfigBuilder builder({{1, 1}, {1 << 15, 1 << 15}});
    builder.maxSequenceLength(1).tokensPerPage(1024).dataType(DataType::kFLOAT);
    KVCacheConfig config = builder.numPages(kMAX_NUM_PAGES).build();
    expectRejected(config, {"layer 1"}, {kMAX_NUM_PAGES});
    // Even one page overflows when heads and head size are both at the int32 limit.
    test::ConfigBuilder hugeLayer({{INT32_MAX, INT32_MAX}});
    KVCacheConfig huge = hugeLayer.maxSequenceLength(1).tokensPerPage(1024).dataType(DataType::kFLOAT).build();
    expectRejected(huge, {"layer 0"}, {INT32_MAX});
}

TEST(Validation, RejectsTotalSizeOverflowing64Bits)
{
    // Each layer holds 2 * (2^30 - 1) pages of 2^30 fp32 elements: 2^63 - 2^33 bytes, which fits; two do not.
    std::vector<KVLayerConfig> const layers(2, KVLayerConfig{1 << 15, 1 << 15});
    test::ConfigBuilder builder(layers);
    builder.maxSequenceLength(1).tokensPerPage(1).dataType(DataType::kFLOAT).numPages(kMAX_NUM_PAGES);
    KVCacheConfig const config = builder.build();
    int64_t const layerBytes = (int64_t{1} << 62) - (int64_t{1} << 33) + (int64_t{1} << 62);
    expectRejected(config, {"overflow"}, {layerBytes});
    // The same with one layer.
    KVCacheConfig single = config;
    single.layerConfigs.pop_back();
    single.numAttentionLayers = 1;
    EXPECT_EQ(computeLayout(single).cacheBytes, layerBytes);
}

TEST(Validation, RejectsPaddedCapacityOverflowingInt32)
{
    // In pages of 1024 the largest padded length that fits int32 is 2^31 - 1024 = INT32_MAX - 1023 (2^21 - 1 pages);
    // one token more rounds up to 2^31.
    KVCacheConfig config = oneInt8Element().maxSequenceLength(INT32_MAX - 1022).tokensPerPage(1024).build();
    expectRejected(config, {"maxSequenceLength"}, {kINT32_LIMIT - 1022});
    config.maxSequenceLength = INT32_MAX - 5;
    expectRejected(config, {"maxSequenceLength"}, {kINT32_LIMIT - 5});
    config.maxSequenceLength = INT32_MAX - 1023;
    KVCacheLayout const largest = computeLayout(config);
    EXPECT_EQ(largest.capPadded, 2147482624);
    EXPECT_EQ(largest.pagesPerSlot, 2097151);
}

// ---------------------------------------------------------------------------------------------------------------
// Budget maths

TEST(Budget, WorkedExampleByHand)
{
    // The worked example costs 2 * (8192 + 65536) = 147456 bytes per page id.
    KVCacheConfig const config = workedExample().build();
    EXPECT_EQ(maxPagesForBudget(config, 147456 * 20), 20);
    EXPECT_EQ(maxPagesForBudget(config, 147456 * 20 - 1), 19);
    EXPECT_EQ(maxPagesForBudget(config, 147456 * 20 + 147455), 20);
    EXPECT_EQ(maxPagesForBudget(config, 147455), 0);
    EXPECT_EQ(maxPagesForBudget(config, 147456), 1);
}

TEST(Budget, ZeroBudgetGivesZeroPages)
{
    EXPECT_EQ(maxPagesForBudget(validConfig(), 0), 0);
}

TEST(Budget, NegativeBudgetThrows)
{
    EXPECT_THROW(static_cast<void>(maxPagesForBudget(validConfig(), -1)), InvalidArgumentError);
    EXPECT_THROW(
        static_cast<void>(maxPagesForBudget(validConfig(), std::numeric_limits<int64_t>::min())), InvalidArgumentError);
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>(
        [] { static_cast<void>(maxPagesForBudget(validConfig(), -7)); }, {"budgetBytes", "-7"}));
}

TEST(Budget, InvalidConfigThrows)
{
    KVCacheConfig config = validConfig();
    config.layerConfigs[0].headDim = 0;
    EXPECT_THROW(static_cast<void>(maxPagesForBudget(config, int64_t{1} << 30)), InvalidConfigError);
}

TEST(Budget, IgnoresTheConfigsOwnPageCount)
{
    // numPages below the minimum would be rejected by computeLayout, but the budget question does not use it.
    KVCacheConfig const config = workedExample().numPages(5).build();
    EXPECT_EQ(maxPagesForBudget(config, 147456 * 7), 7);
}

TEST(Budget, CappedAtTheLargestPageCount)
{
    // One page of one int8 element per half costs 2 bytes; any budget over 2 * kMAX_NUM_PAGES hits the cap.
    KVCacheConfig const config = oneInt8Element().build();
    EXPECT_EQ(maxPagesForBudget(config, 2 * int64_t{kMAX_NUM_PAGES}), kMAX_NUM_PAGES);
    EXPECT_EQ(maxPagesForBudget(config, 2 * int64_t{kMAX_NUM_PAGES} - 1), kMAX_NUM_PAGES - 1);
    EXPECT_EQ(maxPagesForBudget(config, 2 * int64_t{kMAX_NUM_PAGES} + 2), kMAX_NUM_PAGES);
    EXPECT_EQ(maxPagesForBudget(config, kINT64_LIMIT), kMAX_NUM_PAGES);
}

TEST(Budget, ZeroLayersCostNothingSoTheCapApplies)
{
    KVCacheConfig const config = noLayers().maxBatchSize(2).maxSequenceLength(50).tokensPerPage(16).build();
    EXPECT_EQ(maxPagesForBudget(config, 0), kMAX_NUM_PAGES);
    EXPECT_EQ(maxPagesForBudget(config, 12345), kMAX_NUM_PAGES);
}

TEST(Budget, RandomConfigsFitTheirBudget)
{
    std::mt19937 rng(99U);
    RandomLimits const limits{6, 16, 256, 16, 4096, 10};
    for (int32_t trial = 0; trial < 300; ++trial)
    {
        KVCacheConfig const config = randomConfig(rng, limits, false);
        test::LayoutModel const model = test::modelLayout(config);
        SCOPED_TRACE("trial " + std::to_string(trial));
        // A budget between minPages and 3 * minPages pages, plus a part of a page.
        int64_t const wholePages = model.minPages + std::uniform_int_distribution<int64_t>(0, 2 * model.minPages)(rng);
        int64_t const spare = std::uniform_int_distribution<int64_t>(0, model.bytesPerPage - 1)(rng);
        int64_t const budget = wholePages * model.bytesPerPage + spare;
        int64_t const expected = std::min<int64_t>(budget / model.bytesPerPage, kMAX_NUM_PAGES);
        int64_t const pages = maxPagesForBudget(config, budget);
        ASSERT_EQ(pages, expected) << "budget " << budget << ", bytes per page " << model.bytesPerPage;

        KVCacheConfig fitted = config;
        fitted.numPages = static_cast<int32_t>(pages);
        EXPECT_LE(computeLayout(fitted).cacheBytes, budget);
        fitted.numPages = static_cast<int32_t>(pages + 1);
        EXPECT_GT(computeLayout(fitted).cacheBytes, budget);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// LayerRef's address maths, compiled here without nvcc: the header must work from host code alone.

static_assert(std::is_trivially_copyable_v<LayerRef>, "kernels take a LayerRef by value");
static_assert(std::is_standard_layout_v<LayerRef>);

TEST(LayerRef, DefaultRefersToNothing)
{
    LayerRef const ref;
    EXPECT_EQ(ref.kPool, nullptr);
    EXPECT_EQ(ref.vPool, nullptr);
    EXPECT_EQ(ref.pageStride, 0);
    EXPECT_EQ(ref.elementBytes, 0);
    EXPECT_EQ(ref.numPages, 0);
}

//! Takes the model's LayerRef of each layer over a host buffer of the layer's size and checks offset(), k<Bits>(),
//! v<Bits>(), kAddress() and vAddress() of every (page, token, head) against the model's byte offsets.
template <typename Bits>
void expectLayerRefMathsMatchModel(KVCacheConfig const& config)
{
    test::LayoutModel const model = test::modelLayout(config);
    ASSERT_EQ(model.elementBytes, static_cast<int64_t>(sizeof(Bits)));
    for (size_t layer = 0; layer < model.layers.size(); ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        test::ModelLayer const& ml = model.layers[layer];
        std::vector<Bits> buffer(static_cast<size_t>(2 * ml.halfElems));
        LayerRef const ref = model.layerRef(static_cast<int32_t>(layer), buffer.data());
        auto const* const base = reinterpret_cast<char const*>(buffer.data());
        auto const bytesTo = [base](void const* p) { return static_cast<int64_t>(static_cast<char const*>(p) - base); };
        for (int32_t page = 0; page < ref.numPages; ++page)
        {
            for (int32_t token = 0; token < ref.tokensPerPage; ++token)
            {
                for (int32_t head = 0; head < ref.numKVHeads; ++head)
                {
                    SCOPED_TRACE("page " + std::to_string(page) + ", token " + std::to_string(token) + ", head "
                        + std::to_string(head));
                    auto const at = static_cast<int32_t>(layer);
                    int64_t const kByte = model.poolByteOffset(at, 0, page, token, head, 0);
                    int64_t const vByte = model.poolByteOffset(at, 1, page, token, head, 0);
                    ASSERT_EQ(ref.offset(page, token, head) * model.elementBytes, kByte);
                    ASSERT_EQ(bytesTo(ref.k<Bits>(page, token, head)), kByte);
                    ASSERT_EQ(bytesTo(ref.v<Bits>(page, token, head)), vByte);
                    ASSERT_EQ(bytesTo(ref.kAddress(page, token, head)), kByte);
                    ASSERT_EQ(bytesTo(ref.vAddress(page, token, head)), vByte);
                }
            }
        }
    }
}

TEST(LayerRef, AddressMathsMatchTheModelForEveryElementSize)
{
    // Odd head sizes, page sizes that do not divide the 10-token sequence, and one page beyond the minimum.
    for (int32_t const pageSize : {1, 4, 16})
    {
        SCOPED_TRACE("tokensPerPage " + std::to_string(pageSize));
        test::ConfigBuilder builder({{2, 3}, {1, 7}, {3, 5}});
        builder.maxBatchSize(2).maxSequenceLength(10).tokensPerPage(pageSize);
        int64_t const minPages = test::modelLayout(builder.build()).minPages;
        builder.numPages(static_cast<int32_t>(minPages + 1));
        expectLayerRefMathsMatchModel<uint32_t>(builder.dataType(DataType::kFLOAT).build());
        expectLayerRefMathsMatchModel<uint16_t>(builder.dataType(DataType::kBF16).build());
        expectLayerRefMathsMatchModel<uint8_t>(builder.dataType(DataType::kFP8_E5M2).build());
    }
}

} // namespace
} // namespace kvcache::rt
