#include "kvcache/data_type.h"
#include "kvcache/errors.h"
#include "kvcache/kv_cache_config.h"
#include "kvcache/kv_cache_layout.h"
#include "kvcache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace
{

using kvcache::rt::computeLayout;
using kvcache::rt::DataType;
using kvcache::rt::InvalidArgumentError;
using kvcache::rt::InvalidConfigError;
using kvcache::rt::kMAX_NUM_PAGES;
using kvcache::rt::KVCacheConfig;
using kvcache::rt::KVCacheLayout;
using kvcache::rt::KVCacheManager;
using kvcache::rt::KVLayerConfig;
using kvcache::rt::maxPagesForBudget;

constexpr int64_t kINT32_LIMIT = std::numeric_limits<int32_t>::max();
constexpr int64_t kINT64_LIMIT = std::numeric_limits<int64_t>::max();

static_assert(std::is_base_of_v<std::runtime_error, InvalidConfigError>);

// The KV cache element types with their sizes, written out by hand.
struct KVType
{
    DataType type;
    int64_t bytes;
};
constexpr std::array<KVType, 7> kKV_TYPES = {{
    {DataType::kFLOAT, 4},
    {DataType::kHALF, 2},
    {DataType::kBF16, 2},
    {DataType::kFP8_E4M3, 1},
    {DataType::kFP8_E5M2, 1},
    {DataType::kINT8, 1},
    {DataType::kUINT8, 1},
}};

int64_t elementBytesByHand(DataType type)
{
    for (KVType const& kv : kKV_TYPES)
    {
        if (kv.type == type)
        {
            return kv.bytes;
        }
    }
    ADD_FAILURE() << "not a KV cache type: " << static_cast<int32_t>(type);
    return 0;
}

KVCacheConfig makeConfig(int32_t batch, int32_t maxSequenceLength, int32_t tokensPerPage,
    std::vector<KVLayerConfig> const& layers, DataType type = DataType::kHALF, int32_t numPages = 0)
{
    KVCacheConfig config;
    config.numAttentionLayers = static_cast<int32_t>(layers.size());
    config.maxBatchSize = batch;
    config.maxSequenceLength = maxSequenceLength;
    config.layerConfigs = layers;
    config.kvCacheType = type;
    config.numPages = numPages;
    config.tokensPerPage = tokensPerPage;
    return config;
}

// ---------------------------------------------------------------------------------------------------------------
// An independent model of the layout: pages are counted one at a time, sizes are summed layer by layer.

struct ModelLayer
{
    int64_t pageElems;
    int64_t pageBytes;
    int64_t halfElems;
    int64_t layerBytes;
};

struct Model
{
    int64_t capPadded;
    int64_t pagesPerSlot;
    int64_t minPages;
    int64_t numPages;
    std::vector<ModelLayer> layers;
    int64_t cacheBytes;
    int64_t bytesPerPage;
};

Model bruteForceModel(KVCacheConfig const& config)
{
    Model model{};
    int64_t const pageSize = config.tokensPerPage;
    // Add pages to a slot until they hold the longest sequence.
    while (model.pagesPerSlot * pageSize < config.maxSequenceLength)
    {
        ++model.pagesPerSlot;
    }
    model.capPadded = model.pagesPerSlot * pageSize;
    for (int32_t slot = 0; slot < config.maxBatchSize; ++slot)
    {
        model.minPages += model.pagesPerSlot;
    }
    model.numPages = config.numPages == 0 ? model.minPages : config.numPages;
    int64_t const elementBytes = elementBytesByHand(config.kvCacheType);
    for (KVLayerConfig const& layer : config.layerConfigs)
    {
        ModelLayer m{};
        // One token of one half holds H heads of D elements; a page holds P tokens.
        int64_t const tokenElems = int64_t{layer.numKVHeads} * layer.headDim;
        m.pageElems = pageSize * tokenElems;
        m.pageBytes = m.pageElems * elementBytes;
        m.halfElems = model.numPages * m.pageElems;
        m.layerBytes = 2 * m.halfElems * elementBytes;
        model.cacheBytes += m.layerBytes;
        model.bytesPerPage += 2 * m.pageBytes; // K and V of the same page id
        model.layers.push_back(m);
    }
    return model;
}

void expectLayoutMatchesModel(KVCacheConfig const& config, KVCacheLayout const& layout)
{
    Model const model = bruteForceModel(config);
    EXPECT_EQ(layout.tokensPerPage, config.tokensPerPage);
    EXPECT_EQ(layout.capPadded, model.capPadded);
    EXPECT_EQ(layout.pagesPerSlot, model.pagesPerSlot);
    EXPECT_EQ(layout.minPages, model.minPages);
    EXPECT_EQ(layout.numPages, model.numPages);
    EXPECT_EQ(layout.elementBytes, elementBytesByHand(config.kvCacheType));
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
    int32_t const shift = common ? std::uniform_int_distribution<int32_t>(4, 7)(rng)
                                 : std::uniform_int_distribution<int32_t>(0, 10)(rng);
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
    int32_t const pageSize
        = limits.maxPageShift >= 10 ? randomPageSize(rng) : int32_t{1} << pick(0, limits.maxPageShift);
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
    DataType const type = kKV_TYPES[static_cast<size_t>(pick(0, static_cast<int32_t>(kKV_TYPES.size()) - 1))].type;
    KVCacheConfig config = makeConfig(batch, maxSequenceLength, pageSize, layers, type);
    if (retainPages)
    {
        int32_t const pagesPerSlot = (maxSequenceLength + pageSize - 1) / pageSize;
        config.numPages = batch * pagesPerSlot + pick(1, batch * pagesPerSlot + 3);
    }
    return config;
}

// ---------------------------------------------------------------------------------------------------------------
// Layout maths

TEST(Layout, WorkedExampleByHand)
{
    // 3 slots of 100 tokens in pages of 32: 4 pages (128 tokens) per slot, 12 pages.
    // Layer 0: 32 * 2 * 64 = 4096 elements per page, 8192 bytes in fp16; 12 pages: 49152 elements, 196608 bytes.
    // Layer 1: 32 * 8 * 128 = 32768 elements per page, 65536 bytes; 12 pages: 393216 elements, 1572864 bytes.
    KVCacheConfig const config = makeConfig(3, 100, 32, {{2, 64}, {8, 128}}, DataType::kHALF);
    KVCacheLayout const layout = computeLayout(config);
    EXPECT_EQ(layout.tokensPerPage, 32);
    EXPECT_EQ(layout.capPadded, 128);
    EXPECT_EQ(layout.pagesPerSlot, 4);
    EXPECT_EQ(layout.minPages, 12);
    EXPECT_EQ(layout.numPages, 12);
    EXPECT_EQ(layout.elementBytes, 2);
    ASSERT_EQ(layout.layers.size(), 2U);
    EXPECT_EQ(layout.layers[0].pageElems, 4096);
    EXPECT_EQ(layout.layers[0].pageBytes, 8192);
    EXPECT_EQ(layout.layers[0].halfElems, 49152);
    EXPECT_EQ(layout.layers[0].layerBytes, 196608);
    EXPECT_EQ(layout.layers[1].pageElems, 32768);
    EXPECT_EQ(layout.layers[1].pageBytes, 65536);
    EXPECT_EQ(layout.layers[1].halfElems, 393216);
    EXPECT_EQ(layout.layers[1].layerBytes, 1572864);
    EXPECT_EQ(layout.cacheBytes, 196608 + 1572864);
    EXPECT_EQ(layout.bytesPerPage, 2 * (8192 + 65536));
}

TEST(Layout, DefaultPageSizeAndRetainedPagesByHand)
{
    // Default 128-token pages: 300 tokens need 3 pages (384 tokens); 2 slots need 6, 10 are retained.
    // fp32, 4 heads of 16: 128 * 64 = 8192 elements per page, 32768 bytes; 10 pages: 81920 elements, 655360 bytes.
    KVCacheConfig config = makeConfig(2, 300, kvcache::rt::kTOKENS_PER_PAGE, {{4, 16}}, DataType::kFLOAT, 10);
    EXPECT_EQ(KVCacheConfig{}.tokensPerPage, 128);
    KVCacheLayout const layout = KVCacheManager::validate(config);
    EXPECT_EQ(layout.capPadded, 384);
    EXPECT_EQ(layout.pagesPerSlot, 3);
    EXPECT_EQ(layout.minPages, 6);
    EXPECT_EQ(layout.numPages, 10);
    ASSERT_EQ(layout.layers.size(), 1U);
    EXPECT_EQ(layout.layers[0].pageElems, 8192);
    EXPECT_EQ(layout.layers[0].halfElems, 81920);
    EXPECT_EQ(layout.layers[0].layerBytes, 655360);
    EXPECT_EQ(layout.cacheBytes, 655360);
    EXPECT_EQ(layout.bytesPerPage, 65536);
}

TEST(Layout, ExactMultipleAndShortSequences)
{
    // A sequence that fills its pages exactly is not padded; one shorter than a page still takes a page.
    KVCacheLayout const exact = computeLayout(makeConfig(2, 256, 64, {{1, 8}}));
    EXPECT_EQ(exact.capPadded, 256);
    EXPECT_EQ(exact.pagesPerSlot, 4);
    EXPECT_EQ(exact.minPages, 8);
    KVCacheLayout const shortSequence = computeLayout(makeConfig(5, 3, 1024, {{1, 8}}));
    EXPECT_EQ(shortSequence.capPadded, 1024);
    EXPECT_EQ(shortSequence.pagesPerSlot, 1);
    EXPECT_EQ(shortSequence.minPages, 5);
    KVCacheLayout const onePerPage = computeLayout(makeConfig(3, 7, 1, {{1, 8}}));
    EXPECT_EQ(onePerPage.capPadded, 7);
    EXPECT_EQ(onePerPage.minPages, 21);
}

TEST(Layout, ZeroLayersIsValid)
{
    KVCacheConfig const config = makeConfig(4, 100, 16, {});
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
    KVCacheConfig const config = makeConfig(1, 1, 1, {{1, 1}}, DataType::kINT8, kMAX_NUM_PAGES);
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
    Model const model = bruteForceModel(config);
    ASSERT_EQ(layout.capPadded, model.capPadded);
    ASSERT_EQ(layout.pagesPerSlot, model.pagesPerSlot);
    int64_t const batch = config.maxBatchSize;
    int64_t const cap = model.capPadded;
    int64_t const pageSize = config.tokensPerPage;
    int64_t const pagesPerSlot = model.pagesPerSlot;
    int64_t const e = elementBytesByHand(config.kvCacheType);
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
                            int64_t const poolByte
                                = (kv * halfElems + ((page * pageSize + t) * heads + h) * dim + d) * e;
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
    checkSlotViewAgainstPool(makeConfig(3, 10, 4, {{2, 3}}, DataType::kHALF));
    checkSlotViewAgainstPool(makeConfig(2, 5, 1, {{1, 2}, {3, 1}}, DataType::kFLOAT));
    checkSlotViewAgainstPool(makeConfig(1, 9, 8, {{2, 2}}, DataType::kFP8_E4M3));
    checkSlotViewAgainstPool(makeConfig(4, 16, 16, {{1, 4}, {2, 8}, {4, 2}}, DataType::kBF16));
}

TEST(SlotView, RetainedPagesKeepSeparateViewsButBreakCombined)
{
    checkSlotViewAgainstPool(makeConfig(3, 10, 4, {{2, 3}}, DataType::kHALF, 10));
    checkSlotViewAgainstPool(makeConfig(2, 7, 2, {{1, 1}, {2, 5}}, DataType::kUINT8, 9));
    checkSlotViewAgainstPool(makeConfig(1, 1, 1, {{1, 1}}, DataType::kINT8, 2));
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
        try
        {
            static_cast<void>(throughManager ? KVCacheManager::validate(config) : computeLayout(config));
            ADD_FAILURE() << "config was accepted";
        }
        catch (InvalidConfigError const& error)
        {
            std::string const message = error.what();
            for (std::string const& word : words)
            {
                EXPECT_NE(message.find(word), std::string::npos) << "message lacks \"" << word << "\": " << message;
            }
            for (int64_t const number : numbers)
            {
                EXPECT_TRUE(mentionsNumber(message, number)) << "message lacks " << number << ": " << message;
            }
        }
        catch (std::exception const& error)
        {
            ADD_FAILURE() << "wrong exception type: " << error.what();
        }
    }
}

KVCacheConfig validConfig()
{
    return makeConfig(4, 1000, 64, {{8, 128}, {2, 64}, {4, 96}}, DataType::kHALF);
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
    KVCacheConfig config = validConfig();
    config.kvCacheType = DataType::kINT32;
    expectRejected(config, {"kvCacheType", "int32"}, {});
}

TEST(Validation, RejectsInt64DataType)
{
    KVCacheConfig config = validConfig();
    config.kvCacheType = DataType::kINT64;
    expectRejected(config, {"kvCacheType", "int64"}, {});
}

TEST(Validation, RejectsDataTypeOutsideTheEnumeration)
{
    KVCacheConfig config = validConfig();
    config.kvCacheType = static_cast<DataType>(99);
    expectRejected(config, {"kvCacheType"}, {99});
}

TEST(Validation, RejectsNegativeLayerCount)
{
    KVCacheConfig config = validConfig();
    config.numAttentionLayers = -3;
    expectRejected(config, {"numAttentionLayers"}, {-3});
}

TEST(Validation, RejectsNonPositiveBatch)
{
    KVCacheConfig config = validConfig();
    config.maxBatchSize = 0;
    expectRejected(config, {"maxBatchSize"}, {0});
    config.maxBatchSize = -7;
    expectRejected(config, {"maxBatchSize"}, {-7});
}

TEST(Validation, RejectsNonPositiveSequenceLength)
{
    KVCacheConfig config = validConfig();
    config.maxSequenceLength = 0;
    expectRejected(config, {"maxSequenceLength"}, {0});
    config.maxSequenceLength = -12;
    expectRejected(config, {"maxSequenceLength"}, {-12});
}

TEST(Validation, RejectsLayerConfigCountMismatch)
{
    KVCacheConfig config = validConfig();
    config.numAttentionLayers = 2;
    expectRejected(config, {"layerConfigs", "numAttentionLayers"}, {3, 2});
    config.numAttentionLayers = 5;
    expectRejected(config, {"layerConfigs", "numAttentionLayers"}, {3, 5});
}

TEST(Validation, RejectsNonPositiveHeadsNamingTheLayer)
{
    KVCacheConfig config = validConfig();
    config.layerConfigs[2].numKVHeads = 0;
    expectRejected(config, {"numKVHeads", "[2]"}, {0});
    config.layerConfigs[2].numKVHeads = -5;
    expectRejected(config, {"numKVHeads", "[2]"}, {-5});
}

TEST(Validation, RejectsNonPositiveHeadDimNamingTheLayer)
{
    KVCacheConfig config = validConfig();
    config.layerConfigs[1].headDim = 0;
    expectRejected(config, {"headDim", "[1]"}, {0});
    config.layerConfigs[1].headDim = -64;
    expectRejected(config, {"headDim", "[1]"}, {-64});
}

TEST(Validation, RejectsPageSizeThatIsNotAPowerOfTwo)
{
    for (int32_t const pageSize : {3, 96, 100, 1000})
    {
        KVCacheConfig config = validConfig();
        config.tokensPerPage = pageSize;
        expectRejected(config, {"tokensPerPage"}, {pageSize});
    }
}

TEST(Validation, RejectsZeroOrNegativePageSize)
{
    for (int32_t const pageSize : {0, -16})
    {
        KVCacheConfig config = validConfig();
        config.tokensPerPage = pageSize;
        expectRejected(config, {"tokensPerPage"}, {pageSize});
    }
}

TEST(Validation, RejectsPageSizeAboveLimit)
{
    for (int32_t const pageSize : {2048, 1 << 20})
    {
        KVCacheConfig config = validConfig();
        config.tokensPerPage = pageSize;
        expectRejected(config, {"tokensPerPage"}, {pageSize, 1024});
    }
    KVCacheConfig config = validConfig();
    config.tokensPerPage = 1024;
    EXPECT_NO_THROW(static_cast<void>(computeLayout(config)));
}

TEST(Validation, RejectsFewerPagesThanTheMinimum)
{
    // 4 slots of 1000 tokens in pages of 64: 16 pages per slot, 64 pages at least.
    KVCacheConfig config = validConfig();
    config.numPages = 5;
    expectRejected(config, {"numPages"}, {5, 64});
    config.numPages = 63;
    expectRejected(config, {"numPages"}, {63, 64});
    config.numPages = 64;
    EXPECT_EQ(computeLayout(config).numPages, 64);
}

TEST(Validation, RejectsPageCountWhoseVIdsOverflowInt32)
{
    KVCacheConfig config = makeConfig(1, 1, 1, {{1, 1}}, DataType::kINT8);
    config.numPages = kMAX_NUM_PAGES + 1;
    expectRejected(config, {"numPages"}, {1073741824});
    config.numPages = std::numeric_limits<int32_t>::max();
    expectRejected(config, {"numPages"}, {kINT32_LIMIT});
}

TEST(Validation, RejectsMinimumPageCountWhoseVIdsOverflowInt32)
{
    // 2^20 slots of 2^11 one-token pages need 2^31 pages.
    KVCacheConfig const config = makeConfig(1 << 20, 1 << 11, 1, {{1, 1}}, DataType::kINT8);
    expectRejected(config, {"maxBatchSize"}, {1 << 20});
}

TEST(Validation, RejectsSizesOverflowing64Bits)
{
    // Layer 1 has 2^15 * 2^15 * 2^10 = 2^40 elements per page; times 1073741823 pages leaves int64.
    KVCacheConfig config = makeConfig(1, 1, 1024, {{1, 1}, {1 << 15, 1 << 15}}, DataType::kFLOAT, kMAX_NUM_PAGES);
    expectRejected(config, {"layer 1"}, {kMAX_NUM_PAGES});
    // Even one page overflows when heads and head size are both at the int32 limit.
    KVCacheConfig huge = makeConfig(1, 1, 1024, {{INT32_MAX, INT32_MAX}}, DataType::kFLOAT);
    expectRejected(huge, {"layer 0"}, {INT32_MAX});
}

TEST(Validation, RejectsTotalSizeOverflowing64Bits)
{
    // Each layer holds 2 * (2^30 - 1) pages of 2^30 fp32 elements: 2^63 - 2^33 bytes, which fits; two do not.
    std::vector<KVLayerConfig> const layers(2, KVLayerConfig{1 << 15, 1 << 15});
    KVCacheConfig const config = makeConfig(1, 1, 1, layers, DataType::kFLOAT, kMAX_NUM_PAGES);
    int64_t const layerBytes = (int64_t{1} << 62) - (int64_t{1} << 33) + (int64_t{1} << 62);
    expectRejected(config, {"overflow"}, {layerBytes});
    KVCacheConfig const single = makeConfig(1, 1, 1, {layers[0]}, DataType::kFLOAT, kMAX_NUM_PAGES);
    EXPECT_EQ(computeLayout(single).cacheBytes, layerBytes);
}

TEST(Validation, RejectsPaddedCapacityOverflowingInt32)
{
    // In pages of 1024 the largest padded length that fits int32 is 2^31 - 1024 = INT32_MAX - 1023 (2^21 - 1 pages);
    // one token more rounds up to 2^31.
    KVCacheConfig config = makeConfig(1, INT32_MAX - 1022, 1024, {{1, 1}}, DataType::kINT8);
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
    KVCacheConfig const config = makeConfig(3, 100, 32, {{2, 64}, {8, 128}}, DataType::kHALF);
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
    EXPECT_THROW(static_cast<void>(maxPagesForBudget(validConfig(), std::numeric_limits<int64_t>::min())),
        InvalidArgumentError);
    try
    {
        static_cast<void>(maxPagesForBudget(validConfig(), -7));
        FAIL() << "a negative budget was accepted";
    }
    catch (InvalidArgumentError const& error)
    {
        EXPECT_NE(std::string(error.what()).find("budgetBytes"), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find("-7"), std::string::npos) << error.what();
    }
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
    KVCacheConfig config = makeConfig(3, 100, 32, {{2, 64}, {8, 128}}, DataType::kHALF, 5);
    EXPECT_EQ(maxPagesForBudget(config, 147456 * 7), 7);
}

TEST(Budget, CappedAtTheLargestPageCount)
{
    // One page of one int8 element per half costs 2 bytes; any budget over 2 * kMAX_NUM_PAGES hits the cap.
    KVCacheConfig const config = makeConfig(1, 1, 1, {{1, 1}}, DataType::kINT8);
    EXPECT_EQ(maxPagesForBudget(config, 2 * int64_t{kMAX_NUM_PAGES}), kMAX_NUM_PAGES);
    EXPECT_EQ(maxPagesForBudget(config, 2 * int64_t{kMAX_NUM_PAGES} - 1), kMAX_NUM_PAGES - 1);
    EXPECT_EQ(maxPagesForBudget(config, 2 * int64_t{kMAX_NUM_PAGES} + 2), kMAX_NUM_PAGES);
    EXPECT_EQ(maxPagesForBudget(config, kINT64_LIMIT), kMAX_NUM_PAGES);
}

TEST(Budget, ZeroLayersCostNothingSoTheCapApplies)
{
    KVCacheConfig const config = makeConfig(2, 50, 16, {});
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
        Model const model = bruteForceModel(config);
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

} // namespace
