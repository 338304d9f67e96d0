#pragma once

// What the page-op tests check the kernels against: a manager whose device buffers hold the same random bytes as its
// host model (support/reference_cache.h), and the configs and targets the tests share. Byte for byte: every test
// compares every byte of every layer.

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/layout_model.h"
#include "support/reference_cache.h"

namespace kvcache::test
{

//! A manager on its own stream, its buffers filled with random bytes, and the host model of those buffers.
class CacheUnderTest
{
public:
    //! Builds the manager and fills it; throws std::runtime_error when the manager's pools are not where the model
    //! puts them (every later comparison would then be meaningless): V one half after K, or none for a latent layer.
    CacheUnderTest(rt::KVCacheConfig const& config, uint64_t seed)
        : mCache(config, mStream.get())
        , mReference(config)
        , mRng(seed)
    {
        for (int32_t layer = 0; layer < mReference.numLayers(); ++layer)
        {
            auto const* kPool = static_cast<char const*>(mCache.kPoolPtr(layer));
            auto const* vPool = static_cast<char const*>(mCache.vPoolPtr(layer));
            bool const vWhereModelled =
                mReference.numHalves(layer) == 2 ? vPool - kPool == mReference.halfBytes(layer) : vPool == nullptr;
            if (!vWhereModelled || mCache.getCombinedKVCachePoolView(layer).sizeBytes() != mReference.layerBytes(layer))
            {
                throw std::runtime_error("layer " + std::to_string(layer) + " is not laid out as the reference models");
            }
            if (mReference.hasScales()
                && mCache.scalePoolView(layer).sizeBytes() != static_cast<int64_t>(mReference.scales(layer).size()))
            {
                throw std::runtime_error(
                    "layer " + std::to_string(layer) + "'s scale pool is not sized as the reference models");
            }
        }
        refill();
    }

    //! Returns the manager.
    rt::KVCacheManager const& cache() const noexcept
    {
        return mCache;
    }
    //! Returns the manager, for what changes it besides its pages (its host-held layer scales).
    rt::KVCacheManager& cache() noexcept
    {
        return mCache;
    }
    //! Returns the stream the manager was built on.
    cudaStream_t stream() const noexcept
    {
        return mStream.get();
    }
    //! Returns the host model.
    ReferenceCache& reference() noexcept
    {
        return mReference;
    }
    //! Returns the pages per half of group 0's layers (of every layer when there is one group).
    int32_t numPages() const noexcept
    {
        return mReference.numPages();
    }
    //! Returns the pages per half of the layers of page group `group`.
    int32_t numPages(int32_t group) const
    {
        return mReference.numPages(group);
    }

    //! Gives every buffer (device and model) new random contents.
    void refill()
    {
        mReference.fillRandom(mRng);
        for (int32_t layer = 0; layer < mReference.numLayers(); ++layer)
        {
            uploadBytes(mCache.kPoolPtr(layer), mReference.bytes(layer), stream());
            if (mReference.hasScales())
            {
                uploadBytes(mCache.scalePoolView(layer).rawPointer(), mReference.scales(layer), stream());
            }
        }
    }

    //! Compares every byte of every layer, after the work queued on the manager's stream, with the model.
    ::testing::AssertionResult matchesReference()
    {
        for (int32_t layer = 0; layer < mReference.numLayers(); ++layer)
        {
            std::vector<uint8_t> const actual =
                downloadBytes(mCache.kPoolPtr(layer), mReference.layerBytes(layer), stream());
            std::vector<uint8_t> const& expected = mReference.bytes(layer);
            if (actual != expected)
            {
                return describeMismatch(layer, expected, actual);
            }
            if (mReference.hasScales())
            {
                std::vector<uint8_t> const& expectedScales = mReference.scales(layer);
                std::vector<uint8_t> const actualScales = downloadBytes(
                    mCache.scalePoolView(layer).rawPointer(), static_cast<int64_t>(expectedScales.size()), stream());
                if (actualScales != expectedScales)
                {
                    return describeScaleMismatch(layer, expectedScales, actualScales);
                }
            }
        }
        return ::testing::AssertionSuccess();
    }

    //! Returns `count` pairs of page group `group`'s ids with distinct destinations and sources drawn (repeats
    //! allowed) from the other pages.
    std::vector<rt::PageCopy> randomPairs(int32_t count, int32_t group = 0)
    {
        std::vector<int32_t> const ids = shuffledPages(group);
        std::uniform_int_distribution<size_t> pickSource(static_cast<size_t>(count), ids.size() - 1);
        std::vector<rt::PageCopy> pairs(static_cast<size_t>(count));
        for (size_t i = 0; i < pairs.size(); ++i)
        {
            pairs[i] = rt::PageCopy{ids[pickSource(mRng)], ids[i]};
        }
        return pairs;
    }

    //! Returns `count` distinct page ids of page group `group` in random order.
    std::vector<int32_t> randomPages(int32_t count, int32_t group = 0)
    {
        std::vector<int32_t> ids = shuffledPages(group);
        ids.resize(static_cast<size_t>(count));
        return ids;
    }

private:
    std::vector<int32_t> shuffledPages(int32_t group)
    {
        std::vector<int32_t> ids(static_cast<size_t>(numPages(group)));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), mRng);
        return ids;
    }

    ::testing::AssertionResult describeMismatch(
        int32_t layer, std::vector<uint8_t> const& expected, std::vector<uint8_t> const& actual)
    {
        int64_t mismatches = 0;
        int64_t first = -1;
        for (size_t i = 0; i < expected.size(); ++i)
        {
            if (expected[i] != actual[i])
            {
                first = first < 0 ? static_cast<int64_t>(i) : first;
                ++mismatches;
            }
        }
        int64_t const half = first / mReference.halfBytes(layer);
        int64_t const inHalf = first % mReference.halfBytes(layer);
        std::ostringstream bytes;
        bytes << std::hex << std::setfill('0') << "expected 0x" << std::setw(2)
              << int{expected[static_cast<size_t>(first)]} << ", found 0x" << std::setw(2)
              << int{actual[static_cast<size_t>(first)]};
        return ::testing::AssertionFailure()
            << "layer " << layer << ": " << mismatches << " byte(s) differ from the reference; the first is "
            << (half == 0 ? "K" : "V") << " page " << inHalf / mReference.pageBytes(layer) << " byte "
            << inHalf % mReference.pageBytes(layer) << " (pageBytes " << mReference.pageBytes(layer)
            << "): " << bytes.str();
    }

    ::testing::AssertionResult describeScaleMismatch(
        int32_t layer, std::vector<uint8_t> const& expected, std::vector<uint8_t> const& actual)
    {
        auto const first = static_cast<int64_t>(
            std::mismatch(expected.begin(), expected.end(), actual.begin()).first - expected.begin());
        int64_t const halfBytes =
            mReference.scalePageBytes(layer) * mReference.model().layers.at(static_cast<size_t>(layer)).numPages;
        return ::testing::AssertionFailure()
            << "layer " << layer << ": scales differ from the reference; the first is "
            << (first < halfBytes ? "K" : "V") << " scale page "
            << (first % halfBytes) / mReference.scalePageBytes(layer) << " byte "
            << (first % halfBytes) % mReference.scalePageBytes(layer) << ": expected "
            << int{expected[static_cast<size_t>(first)]} << ", found " << int{actual[static_cast<size_t>(first)]};
    }

    CudaStream mStream;
    rt::KVCacheManager mCache;
    ReferenceCache mReference;
    std::mt19937_64 mRng;
};

//! Starts a config of two slots of two pages each (four minimum pages), `numPages` in all: the rest are retained
//! pages. float16 unless the caller sets another type.
inline ConfigBuilder pagePoolConfig(std::vector<rt::KVLayerConfig> layers, int32_t tokensPerPage, int32_t numPages)
{
    ConfigBuilder builder(std::move(layers));
    builder.maxBatchSize(2).maxSequenceLength(tokensPerPage + 1).tokensPerPage(tokensPerPage).numPages(numPages);
    return builder;
}

//! Layers of different head counts and widths, so every layer has its own page size.
inline std::vector<rt::KVLayerConfig> heterogeneousLayers()
{
    return {{2, 64}, {1, 128}, {3, 40}};
}

//! Runs `check(cut)` on a cache of heterogeneousLayers() holding `type` in 40 pages of 16, 64 and then 128 tokens,
//! seeded with `seed` plus the tokens per page; stops at the first fatal failure.
template <typename Check>
void forEachPageSize(rt::DataType type, uint64_t seed, Check&& check)
{
    for (int32_t const tokensPerPage : {16, 64, 128})
    {
        SCOPED_TRACE("tokensPerPage " + std::to_string(tokensPerPage));
        CacheUnderTest cut(pagePoolConfig(heterogeneousLayers(), tokensPerPage, 40).dataType(type),
            seed + static_cast<uint64_t>(tokensPerPage));
        check(cut);
        if (::testing::Test::HasFatalFailure())
        {
            return;
        }
    }
}

//! Three float16 layers of different shapes and page sizes (1024, 1280 and 768 bytes), 64 pages.
inline rt::KVCacheConfig smallConfig()
{
    return pagePoolConfig({{2, 16}, {1, 40}, {3, 8}}, 16, 64);
}

//! Two small float16 layers (pages of 256 and 768 bytes) with enough pages for lists of over 1500 entries.
inline rt::KVCacheConfig longListConfig()
{
    return pagePoolConfig({{1, 8}, {2, 12}}, 16, 3200);
}

//! Four float16 layers of 33,344-byte pages (32 tokens x 1 head x 521 dims): one whole 32 KiB chunk of 16-byte
//! vectors and a 576-byte tail, a multiple of 16 bytes but not of the 128-byte L2 line, so every other page starts in
//! the middle of a line. 320 pages: lists of 126 entries or more write over 32 MiB (the L2 hint's threshold) and, as
//! the pages are all alike, device lists of over 256 entries run in wide blocks.
inline rt::KVCacheConfig largePageConfig()
{
    return pagePoolConfig({{1, 521}, {1, 521}, {1, 521}, {1, 521}}, 32, 320);
}

//! Returns page ids outside [0, numPages): just below and above the range, far above it and the int32 extremes.
inline std::vector<int32_t> pageIdsOutside(int32_t numPages)
{
    return {-1, -5, numPages, 1 << 30, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
}

//! Returns a readable description of `target` for traces.
inline std::string describe(rt::PageOpTarget const& target)
{
    char const* half = target.half == rt::KVHalf::kK ? "K" : target.half == rt::KVHalf::kV ? "V" : "both";
    return "group " + std::to_string(target.group) + ", layers from " + std::to_string(target.firstLayer) + ", count "
        + std::to_string(target.numLayers) + ", half " + half;
}

//! Targets of smallConfig()'s three layers: all of them, one layer, the last layers, one half, up to the last layer.
inline std::vector<rt::PageOpTarget> targetsOfThreeLayers()
{
    return {
        {0, -1, rt::KVHalf::kBOTH},
        {1, 1, rt::KVHalf::kBOTH},
        {1, -1, rt::KVHalf::kK},
        {0, 2, rt::KVHalf::kV},
        {2, 1, rt::KVHalf::kK},
        {0, 3, rt::KVHalf::kV},
        {2, -1, rt::KVHalf::kBOTH},
    };
}

//! A target that three layers cannot take, with what the rejection's message must name.
struct BadTarget
{
    rt::PageOpTarget target;
    std::string field; //!< the field and its value, e.g. "PageOpTarget.firstLayer is -1"
    std::string limit;

    //! Returns what the message of operation `what` ("copyPages", ...) must name: the operation with the field, and
    //! the limit.
    std::vector<std::string> named(std::string const& what) const
    {
        return {what + ": " + field, limit};
    }
};

//! Returns targets outside three layers: the first layer, the layer count, or the half out of range.
inline std::vector<BadTarget> badTargetsOfThreeLayers()
{
    return {
        {{-1, -1, rt::KVHalf::kBOTH}, "PageOpTarget.firstLayer is -1", "[0, 3)"},
        {{3, -1, rt::KVHalf::kBOTH}, "PageOpTarget.firstLayer is 3", "[0, 3)"},
        {{3, 1, rt::KVHalf::kBOTH}, "PageOpTarget.firstLayer is 3", "[0, 3)"},
        {{0, 4, rt::KVHalf::kBOTH}, "PageOpTarget.numLayers is 4", "[0, 3]"},
        {{2, 2, rt::KVHalf::kBOTH}, "PageOpTarget.numLayers is 2", "[0, 1]"},
        {{0, -2, rt::KVHalf::kBOTH}, "PageOpTarget.numLayers is -2", "[0, 3]"},
        {{0, -1, static_cast<rt::KVHalf>(3)}, "PageOpTarget.half is 3", "kBOTH, kK or kV"},
    };
}

//! Returns the first `count` entries of `list`.
template <typename Item>
std::vector<Item> firstEntries(std::vector<Item> const& list, int32_t count)
{
    return std::vector<Item>(list.begin(), list.begin() + std::min<size_t>(static_cast<size_t>(count), list.size()));
}

} // namespace kvcache::test
