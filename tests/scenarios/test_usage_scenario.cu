// The cache used as a serving loop uses it, the steps examples/quickstart shows: sequences written through LayerRef and
// through the slot view, one forked with copyPages, finished ones reset with resetPages. After every step every byte
// of every layer is compared with a host model placed by support/layout_model.h (never by LayerRef or the views), so
// a wrong address in either shows as a mismatch.

#include <kvcache/kvcache.h>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/gpu_test.h"
#include "support/hashed_value.cuh"
#include "support/layout_model.h"

namespace kvcache::test
{
namespace
{

//! Threads per block of the writing kernels (one block a token).
constexpr int32_t kWRITE_THREADS = 128;
//! Every byte of the cache before the first step: float16 0xA5A5 is no integer, so no written value can equal it.
constexpr uint8_t kBACKGROUND_BYTE = 0xA5;
//! What resetPages writes: float16 -0.5 (0xB800) in the low half-word, 1.5 (0x3E00) in the high one; no integers.
constexpr uint32_t kRESET_PATTERN = 0x3E00B800u;
//! Pages beyond the minimum, which only the pool (LayerRef, pool view) reaches.
constexpr int32_t kRETAINED_PAGES = 4;

//! Returns the value of (head, dim) of token `token` of sequence `sequence` in `layer`'s K (kv 0) or V (kv 1): an
//! integer in [1, 1000], exact in float16, hashed from every index so that a value in the wrong place differs, and
//! negative for V so that K and V cannot stand in for each other.
__host__ __device__ float tokenValue(
    int32_t layer, int32_t kv, int32_t sequence, int32_t token, int32_t head, int32_t dim)
{
    uint32_t const values[] = {static_cast<uint32_t>(layer), static_cast<uint32_t>(kv), static_cast<uint32_t>(sequence),
        static_cast<uint32_t>(token), static_cast<uint32_t>(head), static_cast<uint32_t>(dim)};
    return test::hashedValue(values, 6, kv != 0);
}

//! Writes tokens [0, gridDim.x) of a sequence whose token t lives on pages[t / tokensPerPage], through `ref` by value.
__global__ void writeThroughLayerRefKernel(rt::LayerRef ref, int32_t const* pages, int32_t layer, int32_t sequence,
    int32_t tokensPerPage, int32_t numKVHeads, int32_t headDim)
{
    int32_t const token = static_cast<int32_t>(blockIdx.x);
    int32_t const page = pages[token / tokensPerPage];
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < numKVHeads * headDim; i += static_cast<int32_t>(blockDim.x))
    {
        int32_t const head = i / headDim;
        int32_t const dim = i % headDim;
        ref.k<__half>(page, token % tokensPerPage, head)[dim] =
            __float2half_rn(tokenValue(layer, 0, sequence, token, head, dim));
        ref.v<__half>(page, token % tokensPerPage, head)[dim] =
            __float2half_rn(tokenValue(layer, 1, sequence, token, head, dim));
    }
}

//! Strides, in elements, of a [maxBatchSize, capPadded, H, D] K or V slot view.
struct SlotStrides
{
    int64_t slot;
    int64_t token;
    int64_t head;
    int64_t dim;
};

//! Writes tokens [0, gridDim.x) of a sequence in batch slot `slot` through the K and V slot views.
__global__ void writeThroughSlotViewKernel(__half* k, __half* v, SlotStrides strides, int32_t layer, int32_t sequence,
    int32_t slot, int32_t numKVHeads, int32_t headDim)
{
    int32_t const token = static_cast<int32_t>(blockIdx.x);
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < numKVHeads * headDim; i += static_cast<int32_t>(blockDim.x))
    {
        int32_t const head = i / headDim;
        int32_t const dim = i % headDim;
        int64_t const offset = slot * strides.slot + token * strides.token + head * strides.head + dim * strides.dim;
        k[offset] = __float2half_rn(tokenValue(layer, 0, sequence, token, head, dim));
        v[offset] = __float2half_rn(tokenValue(layer, 1, sequence, token, head, dim));
    }
}

//! How a sequence's K and V reach the cache.
enum class WritePath
{
    kLAYER_REF, //!< a kernel given the layer's LayerRef and the sequence's pages
    kSLOT_VIEW, //!< a kernel given getSeparateKVCache's K and V views and the batch slot
};

//! A sequence: the pages its tokens live on, in order, and how it is written.
struct Sequence
{
    int32_t id = 0;
    int32_t length = 0;
    std::vector<int32_t> pages;
    WritePath path = WritePath::kLAYER_REF;
    int32_t slot = -1; //!< for kSLOT_VIEW: the batch slot, whose pages `pages` must be
};

//! A heterogeneous cache with retained pages, and the host model of every byte it must hold.
class UsageScenarioTest : public GpuTest
{
protected:
    void SetUp() override
    {
        GpuTest::SetUp();
        if (IsSkipped() || HasFatalFailure())
        {
            return;
        }
        ConfigBuilder builder({{8, 64}, {4, 128}, {2, 96}});
        // 300 tokens is no multiple of the page: each slot's last page is partly beyond maxSequenceLength.
        builder.maxBatchSize(4).maxSequenceLength(300).tokensPerPage(64);
        builder.numPages(static_cast<int32_t>(modelLayout(builder).minPages) + kRETAINED_PAGES);
        mModel = modelLayout(builder);
        mStream = std::make_unique<CudaStream>();
        mCache = std::make_unique<rt::KVCacheManager>(builder, mStream->get());
        // cudaMallocAsync memory starts undefined: give every byte a known value, so "unchanged" can be checked.
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            int64_t const layerBytes = mModel.layers[layer].layerBytes;
            KVCACHE_TEST_CUDA(
                cudaMemsetAsync(mCache->kPoolPtr(layer), kBACKGROUND_BYTE, static_cast<size_t>(layerBytes), stream()));
            mExpected.emplace_back(static_cast<size_t>(layerBytes), kBACKGROUND_BYTE);
        }
    }

    cudaStream_t stream() const
    {
        return mStream->get();
    }
    int32_t numLayers() const
    {
        return static_cast<int32_t>(mModel.layers.size());
    }
    //! Returns the pages of the first `length` positions of batch slot `slot`, as the model places them.
    std::vector<int32_t> slotPages(int32_t slot, int32_t length) const
    {
        std::vector<int32_t> pages;
        for (int32_t position = 0; position < length; position += static_cast<int32_t>(mModel.tokensPerPage))
        {
            pages.push_back(static_cast<int32_t>(mModel.slotPage(slot, position)));
        }
        return pages;
    }

    //! Writes `sequence` into every layer of the cache and of the model.
    void write(Sequence const& sequence)
    {
        int32_t const tokensPerPage = static_cast<int32_t>(mModel.tokensPerPage);
        DeviceArray<int32_t> const pages(sequence.pages, stream());
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            int32_t const numKVHeads = static_cast<int32_t>(mModel.layers[layer].numKVHeads);
            int32_t const headDim = static_cast<int32_t>(mModel.layers[layer].headDim);
            if (sequence.path == WritePath::kLAYER_REF)
            {
                writeThroughLayerRefKernel<<<sequence.length, kWRITE_THREADS, 0, stream()>>>(
                    mCache->layerRef(layer), pages.get(), layer, sequence.id, tokensPerPage, numKVHeads, headDim);
            }
            else
            {
                auto const [k, v] = mCache->getSeparateKVCache(layer);
                ASSERT_TRUE(k.getStride() == v.getStride()) << "layer " << layer;
                rt::Coords const& s = k.getStride();
                writeThroughSlotViewKernel<<<sequence.length, kWRITE_THREADS, 0, stream()>>>(k.dataPointer<__half>(),
                    v.dataPointer<__half>(), SlotStrides{s[0], s[1], s[2], s[3]}, layer, sequence.id, sequence.slot,
                    numKVHeads, headDim);
            }
            KVCACHE_TEST_CUDA(cudaGetLastError());
            for (int32_t token = 0; token < sequence.length; ++token)
            {
                int64_t const page = sequence.pages.at(static_cast<size_t>(token / tokensPerPage));
                for (int32_t head = 0; head < numKVHeads; ++head)
                {
                    for (int32_t dim = 0; dim < headDim; ++dim)
                    {
                        for (int32_t kv = 0; kv < 2; ++kv)
                        {
                            __half const value = __float2half_rn(tokenValue(layer, kv, sequence.id, token, head, dim));
                            int64_t const at = mModel.poolByteOffset(layer, kv, page, token % tokensPerPage, head, dim);
                            std::memcpy(&mExpected[layer][static_cast<size_t>(at)], &value, sizeof(value));
                        }
                    }
                }
            }
        }
        mStream->synchronize(); // the kernels read `pages`, freed at return
    }

    //! Copies pages with copyPages in the cache, and in the model.
    void fork(std::vector<rt::PageCopy> const& pairs)
    {
        rt::copyPages(*mCache, pairs, stream());
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            for (rt::PageCopy const& pair : pairs)
            {
                for (int32_t kv = 0; kv < 2; ++kv)
                {
                    std::memcpy(&mExpected[layer][static_cast<size_t>(pageStart(layer, kv, pair.dst))],
                        &mExpected[layer][static_cast<size_t>(pageStart(layer, kv, pair.src))],
                        static_cast<size_t>(mModel.layers[layer].pageBytes));
                }
            }
        }
    }

    //! Fills pages with kRESET_PATTERN with resetPages in the cache, and in the model.
    void reset(std::vector<int32_t> const& pages)
    {
        rt::resetPages(*mCache, pages, stream(), kRESET_PATTERN);
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            for (int32_t const page : pages)
            {
                for (int32_t kv = 0; kv < 2; ++kv)
                {
                    int64_t const start = pageStart(layer, kv, page);
                    for (int64_t i = 0; i < mModel.layers[layer].pageBytes; ++i)
                    {
                        // Little-endian, counted from the start of the page.
                        mExpected[layer][static_cast<size_t>(start + i)] =
                            static_cast<uint8_t>(kRESET_PATTERN >> (8 * (i % 4)));
                    }
                }
            }
        }
    }

    //! Downloads every layer, expects each byte to be the model's and returns the bytes.
    std::vector<std::vector<uint8_t>> expectCacheMatchesModel(char const* step)
    {
        std::vector<std::vector<uint8_t>> actual;
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            actual.push_back(downloadBytes(mCache->kPoolPtr(layer), mModel.layers[layer].layerBytes, stream()));
            std::vector<uint8_t> const& expected = mExpected[layer];
            auto const [got, want] = std::mismatch(actual.back().begin(), actual.back().end(), expected.begin());
            if (got == actual.back().end())
            {
                continue;
            }
            int64_t const at = got - actual.back().begin();
            int64_t const differing = std::inner_product(actual.back().begin(), actual.back().end(), expected.begin(),
                int64_t{0}, std::plus<>(), std::not_equal_to<>());
            ADD_FAILURE() << "after " << step << ", layer " << layer << ": " << differing << " bytes differ, the first "
                          << describe(layer, at) << " is " << static_cast<int>(*got) << ", not "
                          << static_cast<int>(*want);
        }
        return actual;
    }

    //! Returns where (kv, page, 0, 0, 0) of `layer` starts, in bytes from its buffer.
    int64_t pageStart(int32_t layer, int32_t kv, int64_t page) const
    {
        return mModel.poolByteOffset(layer, kv, page, 0, 0, 0);
    }
    //! Names the element that holds byte `at` of `layer`'s buffer.
    std::string describe(int32_t layer, int64_t at) const
    {
        ModelLayer const& m = mModel.layers[layer];
        int64_t const inPage = at % m.halfBytes % m.pageBytes / mModel.elementBytes;
        char text[160];
        std::snprintf(text, sizeof(text), "byte %lld (%s, page %lld, token %lld, head %lld, dim %lld)",
            static_cast<long long>(at), at < m.halfBytes ? "K" : "V",
            static_cast<long long>(at % m.halfBytes / m.pageBytes), static_cast<long long>(inPage / m.tokenElems),
            static_cast<long long>(inPage % m.tokenElems / m.headDim), static_cast<long long>(inPage % m.headDim));
        return text;
    }

    LayoutModel mModel;
    std::unique_ptr<CudaStream> mStream; //!< declared before the cache, which frees its memory on it
    std::unique_ptr<rt::KVCacheManager> mCache;
    std::vector<std::vector<uint8_t>> mExpected; //!< a layer's buffer, byte for byte
};

TEST_F(UsageScenarioTest, WritesForksAndResetsLeaveEveryByteAsModelled)
{
    int32_t const minPages = static_cast<int32_t>(mModel.minPages);
    // Slots 0 and 1 are written through LayerRef along their own pages, slot 2 through the slot view (valid with
    // retained pages when taken separately), and a fourth sequence lives only in retained pages, out of order, where
    // no slot view reaches.
    Sequence const full{1, 300, slotPages(0, 300), WritePath::kLAYER_REF};
    Sequence const forked{2, 130, slotPages(1, 130), WritePath::kLAYER_REF};
    Sequence const finished{3, 77, slotPages(2, 77), WritePath::kSLOT_VIEW, 2};
    Sequence const prefix{4, 100, {minPages + 3, minPages + 1}, WritePath::kLAYER_REF};
    for (Sequence const& sequence : {full, forked, finished, prefix})
    {
        ASSERT_NO_FATAL_FAILURE(write(sequence));
    }
    expectCacheMatchesModel("the writes");

    // Slot 3 continues from slot 1's sequence, and the prefix's first page is shared into another retained page.
    std::vector<rt::PageCopy> pairs;
    std::vector<int32_t> const targets = slotPages(3, forked.length);
    for (size_t i = 0; i < targets.size(); ++i)
    {
        pairs.push_back({forked.pages[i], targets[i]});
    }
    pairs.push_back({prefix.pages[0], minPages});
    fork(pairs);
    std::vector<std::vector<uint8_t>> const afterFork = expectCacheMatchesModel("copyPages");
    for (int32_t layer = 0; layer < numLayers(); ++layer)
    {
        for (rt::PageCopy const& pair : pairs)
        {
            for (int32_t kv = 0; kv < 2; ++kv)
            {
                auto const page = [&](int32_t id) { return afterFork[layer].begin() + pageStart(layer, kv, id); };
                EXPECT_TRUE(std::equal(page(pair.src), page(pair.src) + mModel.layers[layer].pageBytes, page(pair.dst)))
                    << "layer " << layer << (kv == 0 ? " K" : " V") << ": page " << pair.dst << " is no copy of page "
                    << pair.src;
            }
        }
    }

    // Slot 2's sequence finished, and so did slot 1's now that slot 3 holds its fork: one resetPages for both.
    std::vector<int32_t> resets = finished.pages;
    resets.insert(resets.end(), forked.pages.begin(), forked.pages.end());
    reset(resets);
    std::vector<std::vector<uint8_t>> const afterReset = expectCacheMatchesModel("resetPages");

    // The pages no step named still hold the background in every byte.
    std::vector<int32_t> touched = resets;
    for (Sequence const& sequence : {full, prefix})
    {
        touched.insert(touched.end(), sequence.pages.begin(), sequence.pages.end());
    }
    for (rt::PageCopy const& pair : pairs)
    {
        touched.push_back(pair.dst);
    }
    int32_t untouched = 0;
    for (int32_t page = 0; page < static_cast<int32_t>(mModel.numPages); ++page)
    {
        if (std::find(touched.begin(), touched.end(), page) != touched.end())
        {
            continue;
        }
        ++untouched;
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            for (int32_t kv = 0; kv < 2; ++kv)
            {
                auto const begin = afterReset[layer].begin() + pageStart(layer, kv, page);
                EXPECT_TRUE(std::all_of(begin, begin + mModel.layers[layer].pageBytes,
                    [](uint8_t byte) { return byte == kBACKGROUND_BYTE; }))
                    << "layer " << layer << (kv == 0 ? " K" : " V") << ": untouched page " << page << " changed";
            }
        }
    }
    EXPECT_EQ(untouched, 8) << "pages 8, 9, 12, 13, 14, 18, 19 and the retained page " << minPages + 2;
}

} // namespace
} // namespace kvcache::test
