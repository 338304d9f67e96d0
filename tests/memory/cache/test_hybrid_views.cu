// GPU tests of a hybrid cache's views: full-attention KV layers, sliding-window KV layers of two windows, a latent
// full-attention layer and a latent windowed layer, in three page groups. The groups, every view's shape, strides and
// pointers and every LayerRef against the independent layout model; the slot view refused exactly for groups that keep
// pages beyond their minimum; rings written through the slot views (tokens beyond a window's slotTokens wrap to
// token % slotTokens) read back through the pool view's bytes, through LayerRef in a kernel and through the separate
// views; pools written through LayerRef read back through the separate and pool views. A latent layer has K alone and
// its buffer is exactly its K pool.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/tensor.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/layer_ref.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/data_types.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/layout_expectations.h"
#include "support/layout_model.h"
#include "support/view_round_trip.cuh"

namespace kvcache::test
{
namespace
{

template <typename T>
class HybridViewsTest : public TypedGpuTest<T>
{
};

TYPED_TEST_SUITE(HybridViewsTest, OneKVCacheDataTypePerSize, DataTypeNames);

constexpr rt::KVLayerKind kLATENT = rt::KVLayerKind::kLATENT;
constexpr int32_t kBATCH = 3;
constexpr int32_t kSEQUENCE_LENGTH = 100;
constexpr int32_t kTOKENS_PER_PAGE = 8;
constexpr int32_t kSTEP_TOKENS = 4;
//! Bytes of the page kernels' table entry of one layer, as allocatedBytes() documents it.
constexpr int64_t kLAYER_TABLE_ENTRY_BYTES = 16;

//! Three slots of 100 tokens in pages of 8, steps of up to 4 tokens, so that windows keep less than full attention:
//! group 0, full attention, 13 pages (104 tokens) a slot: layers 0 (KV, 4 x 32) and 2 (latent, 48);
//! group 1, window 8, ceil((7 + 4) / 8) + 1 = 3 pages (a ring of 24 tokens) a slot: layers 1 (KV, 2 x 16) and 4
//! (latent, 40);
//! group 2, window 20, ceil((19 + 4) / 8) + 1 = 4 pages (a ring of 32 tokens) a slot: layers 3 (KV, 1 x 24) and 5
//! (KV, 2 x 8).
std::vector<rt::KVLayerConfig> const kLAYERS{
    {4, 32}, {2, 16, 8}, {1, 48, 0, kLATENT}, {1, 24, 20}, {1, 40, 8, kLATENT}, {2, 8, 20}};
//! Each group's minimum pages (3 slots of 13, 3 and 4 pages) and slotTokens.
constexpr int64_t kMIN_PAGES[] = {39, 9, 12};
constexpr int64_t kCAPACITIES[] = {104, 24, 32};
//! Pages of each group when every group retains some beyond its minimum.
std::vector<int32_t> const kRETAINED_PAGES{44, 12, 14};

//! The hybrid config of `type` with `numPagesPerGroup` (empty: every group's minimum).
rt::KVCacheConfig hybridConfig(rt::DataType type, std::vector<int32_t> numPagesPerGroup)
{
    rt::KVCacheConfig config = ConfigBuilder(kLAYERS)
                                   .maxBatchSize(kBATCH)
                                   .maxSequenceLength(kSEQUENCE_LENGTH)
                                   .tokensPerPage(kTOKENS_PER_PAGE)
                                   .dataType(type)
                                   .build();
    config.maxTokensPerStep = kSTEP_TOKENS;
    config.numPagesPerGroup = std::move(numPagesPerGroup);
    return config;
}

//! A hybrid cache on its own stream, its model, and a device counter of accesses that would leave a layer.
struct HybridCache
{
    HybridCache(rt::DataType type, std::vector<int32_t> numPagesPerGroup)
        : config(hybridConfig(type, std::move(numPagesPerGroup)))
        , model(modelLayout(config))
        , manager(config, stream.get())
    {
        outside.fillBytes(0, stream.get());
    }

    rt::KVCacheConfig config;
    LayoutModel model;
    CudaStream stream;
    rt::KVCacheManager manager;
    DeviceArray<unsigned long long> outside{1};
};

std::string whereIs(LayoutModel const& model, int32_t layer)
{
    return "group " + std::to_string(model.layers[static_cast<size_t>(layer)].group) + ", layer "
        + std::to_string(layer);
}

//! Expects the manager to hold exactly the model's buffers and the page kernels' table: no layer larger than the model
//! says (a latent layer's buffer is its K pool alone), so a write past a pool leaves the allocation.
void expectExactBuffers(rt::KVCacheManager const& manager, LayoutModel const& model)
{
    int64_t expected = kLAYER_TABLE_ENTRY_BYTES * static_cast<int64_t>(model.layers.size());
    for (size_t layer = 0; layer < model.layers.size(); ++layer)
    {
        EXPECT_EQ(manager.layout().layers[layer].layerBytes, model.layers[layer].layerBytes) << "layer " << layer;
        expected += model.layers[layer].layerBytes;
    }
    EXPECT_EQ(manager.allocatedBytes(), expected);
    EXPECT_EQ(manager.layout().cacheBytes, model.cacheBytes);
}

//! Checks `layer`'s layout entry, pool view, separate views, pool pointers and LayerRef against the model.
void expectManagerLayerMatchesModel(
    rt::KVCacheManager& manager, LayoutModel const& model, int32_t layer, rt::DataType type)
{
    SCOPED_TRACE(whereIs(model, layer));
    ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
    rt::KVLayerLayout const& actual = manager.layout().layers[static_cast<size_t>(layer)];
    rt::KVLayerConfig const& asked = kLAYERS[static_cast<size_t>(layer)];
    EXPECT_EQ(actual.kind, asked.kind);
    expectLayerMatchesModel(actual, model, static_cast<size_t>(layer));
    EXPECT_EQ(manager.groupOf(layer), ml.group);
    EXPECT_EQ(manager.getLayerConfig(layer).kind, asked.kind);
    EXPECT_EQ(manager.getLayerConfig(layer).slidingWindow, asked.slidingWindow);

    void* const base = manager.kPoolPtr(layer);
    ASSERT_NE(base, nullptr);
    int64_t const p = model.tokensPerPage;
    int64_t const h = ml.numKVHeads;
    int64_t const d = ml.headDim;
    int64_t const cap = ml.slotTokens;
    rt::Tensor const& pool = manager.getCombinedKVCachePoolView(layer);
    EXPECT_TRUE(
        viewIs(pool, base, 0, {ml.numHalves, ml.numPages, p, h, d}, {ml.halfElems, p * h * d, h * d, d, 1}, type))
        << "pool view";
    EXPECT_EQ(pool.sizeBytes(), ml.layerBytes) << "pool view";
    std::pair<rt::Tensor, rt::Tensor> const separate = manager.getSeparateKVCache(layer);
    std::vector<int64_t> const slotShape{model.maxBatchSize, cap, h, d};
    std::vector<int64_t> const slotStrides{cap * h * d, h * d, d, 1};
    EXPECT_TRUE(viewIs(separate.first, base, 0, slotShape, slotStrides, type)) << "separate K view";
    if (ml.numHalves == 2)
    {
        EXPECT_EQ(byteDistance(base, manager.vPoolPtr(layer)), ml.halfBytes);
        EXPECT_TRUE(viewIs(separate.second, base, ml.halfBytes, slotShape, slotStrides, type)) << "separate V view";
    }
    else
    {
        EXPECT_EQ(manager.vPoolPtr(layer), nullptr);
        EXPECT_EQ(separate.second.rawPointer(), nullptr) << "a latent layer's V view must be empty";
        EXPECT_EQ(separate.second.volume(), 0) << "a latent layer's V view must be empty";
        EXPECT_EQ(separate.second.sizeBytes(), 0) << "a latent layer's V view must be empty";
    }
    EXPECT_TRUE(sameLayerRef(manager.layerRef(layer), model.layerRef(layer, base)));
}

TYPED_TEST(HybridViewsTest, GroupsViewsAndLayerRefsMatchTheModel)
{
    HybridCache hybrid(TypeParam::value, kRETAINED_PAGES);
    LayoutModel const& model = hybrid.model;
    rt::KVCacheManager& manager = hybrid.manager;

    // The model against the figures worked out by hand, then the manager against the model.
    ASSERT_EQ(model.groups.size(), 3u);
    for (size_t g = 0; g < 3; ++g)
    {
        EXPECT_EQ(model.groups[g].minPages, kMIN_PAGES[g]) << "group " << g;
        EXPECT_EQ(model.groups[g].pagesPerSequence * model.tokensPerPage, kCAPACITIES[g]) << "group " << g;
    }
    ASSERT_EQ(manager.numGroups(), 3);
    ASSERT_EQ(manager.numLayers(), static_cast<int32_t>(kLAYERS.size()));
    EXPECT_EQ(manager.maxCapPadded(), kCAPACITIES[0]);
    EXPECT_EQ(manager.numPages(), kRETAINED_PAGES[0]);
    EXPECT_EQ(manager.minPages(), kMIN_PAGES[0]);
    EXPECT_EQ(manager.tokensPerPage(), kTOKENS_PER_PAGE);
    EXPECT_FALSE(manager.isUniform());
    for (int32_t g = 0; g < manager.numGroups(); ++g)
    {
        SCOPED_TRACE("group " + std::to_string(g));
        rt::KVPageGroupLayout const& group = manager.group(g);
        expectGroupMatchesModel(group, model, static_cast<size_t>(g));
        EXPECT_EQ(group.numPages, kRETAINED_PAGES[static_cast<size_t>(g)]);
    }
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        expectManagerLayerMatchesModel(manager, model, layer, TypeParam::value);
        // Every group keeps pages beyond its minimum, so no layer has a slot view.
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        EXPECT_TRUE(throwsNaming<rt::InvalidConfigError>([&] { static_cast<void>(manager.getCombinedKVCache(layer)); },
            {"layer " + std::to_string(layer) + " is in page group " + std::to_string(ml.group) + ", whose numPages is "
                    + std::to_string(ml.numPages),
                "minimum " + std::to_string(ml.pagesPerSequence * model.maxBatchSize) + " pages"}))
            << whereIs(model, layer);
    }
    expectExactBuffers(manager, model);
}

TYPED_TEST(HybridViewsTest, SlotViewServesOnlyGroupsAtTheirMinimum)
{
    // Group 0 at its minimum by name, group 1 by default, group 2 with 2 retained pages.
    HybridCache hybrid(TypeParam::value, {static_cast<int32_t>(kMIN_PAGES[0]), 0, kRETAINED_PAGES[2]});
    LayoutModel const& model = hybrid.model;
    rt::KVCacheManager& manager = hybrid.manager;
    ASSERT_EQ(manager.numGroups(), 3);
    EXPECT_EQ(manager.group(0).numPages, kMIN_PAGES[0]);
    EXPECT_EQ(manager.group(1).numPages, kMIN_PAGES[1]);
    EXPECT_EQ(manager.group(2).numPages, kRETAINED_PAGES[2]);
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        SCOPED_TRACE(whereIs(model, layer));
        expectManagerLayerMatchesModel(manager, model, layer, TypeParam::value);
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        if (ml.group == 2)
        {
            EXPECT_TRUE(
                throwsNaming<rt::InvalidConfigError>([&] { static_cast<void>(manager.getCombinedKVCache(layer)); },
                    {"is in page group 2, whose numPages is 14", "minimum 12 pages"}));
            continue;
        }
        // [numHalves, batch, slotTokens, H, D]: the V half (when there is one) starts where the K pool ends.
        int64_t const h = ml.numKVHeads;
        int64_t const d = ml.headDim;
        int64_t const cap = ml.slotTokens;
        EXPECT_EQ(model.maxBatchSize * cap * h * d, ml.halfElems);
        EXPECT_TRUE(viewIs(manager.getCombinedKVCache(layer), manager.kPoolPtr(layer), 0,
            {ml.numHalves, model.maxBatchSize, cap, h, d}, {model.maxBatchSize * cap * h * d, cap * h * d, h * d, d, 1},
            TypeParam::value))
            << "slot view";
    }
    auto const layerCount = static_cast<int32_t>(kLAYERS.size());
    for (int32_t const bad : {-1, layerCount})
    {
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { static_cast<void>(manager.getCombinedKVCache(bad)); },
            {"layer index " + std::to_string(bad) + " is out of range [0, " + std::to_string(layerCount) + ")"}));
    }
    expectExactBuffers(manager, model);
}

// ---------------------------------------------------------------------------------------------------------------
// Data written through one view and read through the others.

constexpr int32_t kMAX_SLOTS = 4;
static_assert(kBATCH <= kMAX_SLOTS);

//! Returns how many tokens slot `slot` of a layer writes: a windowed layer more than its ring holds, so the ring wraps
//! (by a different amount in each slot); a full-attention layer up to a few tokens short of maxSequenceLength.
int64_t tokensWritten(ModelLayer const& ml, int64_t slot)
{
    if (ml.slidingWindow > 0)
    {
        return ml.slotTokens + ml.slotTokens / 2 + 3 + 5 * slot;
    }
    return kSEQUENCE_LENGTH - 7 * slot;
}

//! Returns the token ring position `position` holds once `written` tokens went to positions token % slotTokens (the
//! last to land there), or -1 when none reached it.
int64_t tokenAt(int64_t position, int64_t written, int64_t slotTokens)
{
    return position < written ? position + (written - 1 - position) / slotTokens * slotTokens : -1;
}

//! One layer's slot views as the ring writer addresses them: for each half, the element offset of (0, 0, 0, 0) from
//! the layer's start and the strides of slot, position, head and dim (stride[0..3]); and the tokens each slot writes.
struct RingWrite
{
    ViewMap half[2];
    int64_t numHalves;
    int64_t batch;
    int64_t slotTokens;
    int64_t heads;
    int64_t headDim;
    int64_t written[kMAX_SLOTS];
};

//! One thread a (half, slot, head, dim) writes its slot's tokens in order, token s at ring position s % slotTokens,
//! as elementValue(salt, kv, slot, s, head, dim): the last token to reach a position stays. Writes that would leave
//! the layer's `bufferElems` elements are counted in `outside` instead.
template <typename Bits>
__global__ void writeRingsKernel(
    Bits* buffer, int64_t bufferElems, RingWrite ring, uint64_t salt, unsigned long long* outside)
{
    int64_t const lanes = ring.numHalves * ring.batch * ring.heads * ring.headDim;
    for (int64_t lane = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; lane < lanes;
         lane += int64_t{gridDim.x} * blockDim.x)
    {
        int64_t const dim = lane % ring.headDim;
        int64_t const head = lane / ring.headDim % ring.heads;
        int64_t const slot = lane / (ring.headDim * ring.heads) % ring.batch;
        int64_t const kv = lane / (ring.headDim * ring.heads * ring.batch);
        ViewMap const& view = ring.half[kv];
        for (int64_t token = 0; token < ring.written[slot]; ++token)
        {
            int64_t const elem = view.start + slot * view.stride[0] + token % ring.slotTokens * view.stride[1]
                + head * view.stride[2] + dim * view.stride[3];
            if (elem < 0 || elem >= bufferElems)
            {
                atomicAdd(outside, 1ull);
                continue;
            }
            buffer[elem] = elementValue<Bits>(salt, kv, slot, token, head, dim);
        }
    }
}

//! Through which slot views the rings are written.
enum class SlotWriter
{
    kSEPARATE_VIEWS,
    kCOMBINED_VIEW,
};

//! Poisons every layer, then writes every layer's rings (salt saltBase + layer) through `writer`'s views.
template <typename Bits>
void poisonAndWriteRings(rt::KVCacheManager& manager, LayoutModel const& model, SlotWriter writer, uint64_t saltBase,
    cudaStream_t stream, unsigned long long* outside)
{
    ASSERT_NO_FATAL_FAILURE(poisonLayers(manager, model, stream));
    int64_t const e = sizeof(Bits);
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        SCOPED_TRACE(whereIs(model, layer));
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        auto* const base = static_cast<Bits*>(manager.kPoolPtr(layer));
        RingWrite ring{};
        ring.numHalves = ml.numHalves;
        ring.batch = model.maxBatchSize;
        ring.slotTokens = ml.slotTokens;
        ring.heads = ml.numKVHeads;
        ring.headDim = ml.headDim;
        for (int64_t slot = 0; slot < model.maxBatchSize; ++slot)
        {
            ring.written[slot] = tokensWritten(ml, slot);
        }
        if (writer == SlotWriter::kCOMBINED_VIEW)
        {
            ViewMap slots;
            ASSERT_TRUE(mapView(manager.getCombinedKVCache(layer), base, e, 5, slots));
            for (int64_t kv = 0; kv < ml.numHalves; ++kv)
            {
                ring.half[kv].start = slots.start + kv * slots.stride[0];
                std::copy(slots.stride + 1, slots.stride + 5, ring.half[kv].stride);
            }
        }
        else
        {
            std::pair<rt::Tensor, rt::Tensor> const separate = manager.getSeparateKVCache(layer);
            ASSERT_TRUE(mapView(separate.first, base, e, 4, ring.half[0]));
            if (ml.numHalves == 2)
            {
                ASSERT_TRUE(mapView(separate.second, base, e, 4, ring.half[1]));
            }
        }
        writeRingsKernel<Bits>
            <<<gridFor(ml.numHalves * model.maxBatchSize * ml.numKVHeads * ml.headDim), kBLOCK_SIZE, 0, stream>>>(
                base, ml.numHalves * ml.halfElems, ring, saltBase + static_cast<uint64_t>(layer), outside);
        KVCACHE_TEST_CUDA(cudaGetLastError());
    }
}

//! A layer's pools as the model sizes them, which the LayerRef kernel walks (so a wrong LayerRef field cannot change
//! what it visits), and where the layer's bytes are.
struct ModelPools
{
    int64_t numHalves;
    int64_t numPages;
    int64_t tokensPerPage;
    int64_t heads;
    int64_t headDim;
    char const* layerStart;
    int64_t layerBytes;
};

ModelPools modelPools(rt::KVCacheManager const& manager, LayoutModel const& model, int32_t layer)
{
    ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
    return ModelPools{ml.numHalves, ml.numPages, model.tokensPerPage, ml.numKVHeads, ml.headDim,
        static_cast<char const*>(manager.kPoolPtr(layer)), ml.layerBytes};
}

//! Visits pool element i = (kv, page, token, head, dim) of the model's dense order, for kv below the model's halves,
//! through the accessors of `ref` (taken by value, as an attention kernel takes it): WRITE stores
//! elementValue(salt, kv, page, token, head, dim) there, otherwise the element is copied to out[i]. An element that
//! would lie outside the layer is counted in `outside` and left alone.
template <typename Bits, bool WRITE>
__global__ void layerRefPoolKernel(
    rt::LayerRef ref, ModelPools pools, uint64_t salt, Bits* out, unsigned long long* outside)
{
    int64_t const tokenElems = pools.heads * pools.headDim;
    int64_t const halfElems = pools.numPages * pools.tokensPerPage * tokenElems;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < pools.numHalves * halfElems;
         i += int64_t{gridDim.x} * blockDim.x)
    {
        int64_t const kv = i / halfElems;
        int64_t const inHalf = i % halfElems;
        auto const page = static_cast<int32_t>(inHalf / (pools.tokensPerPage * tokenElems));
        auto const token = static_cast<int32_t>(inHalf / tokenElems % pools.tokensPerPage);
        auto const head = static_cast<int32_t>(inHalf / pools.headDim % pools.heads);
        int64_t const dim = inHalf % pools.headDim;
        Bits* const element = (kv == 0 ? ref.k<Bits>(page, token, head) : ref.v<Bits>(page, token, head)) + dim;
        int64_t const byte = byteDistance(pools.layerStart, element);
        if (byte < 0 || byte + static_cast<int64_t>(sizeof(Bits)) > pools.layerBytes)
        {
            atomicAdd(outside, 1ull);
            continue;
        }
        if constexpr (WRITE)
        {
            *element = elementValue<Bits>(salt, kv, page, token, head, dim);
        }
        else
        {
            out[i] = *element;
        }
    }
}

//! Returns every pool element of `layer` read through its LayerRef in a kernel, in the model's dense order.
template <typename Bits>
std::vector<Bits> readThroughLayerRef(rt::KVCacheManager const& manager, LayoutModel const& model, int32_t layer,
    cudaStream_t stream, unsigned long long* outside)
{
    ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
    int64_t const count = ml.numHalves * ml.halfElems;
    DeviceArray<Bits> out(static_cast<size_t>(count));
    out.fillBytes(0, stream); // no element is ever 0
    layerRefPoolKernel<Bits, false><<<gridFor(count), kBLOCK_SIZE, 0, stream>>>(
        manager.layerRef(layer), modelPools(manager, model, layer), 0, out.get(), outside);
    KVCACHE_CUDA_TRY(cudaGetLastError());
    return out.download(stream);
}

//! Returns success when `actual` and `expected` (in the model's dense pool order of a layer of `ml`'s shape) agree;
//! else names the first differing element as (kv, page, token, head, dim).
template <typename Bits>
::testing::AssertionResult samePoolElements(std::vector<Bits> const& actual, std::vector<Bits> const& expected,
    ModelLayer const& ml, int64_t tokensPerPage, char const* what)
{
    if (actual.size() != expected.size())
    {
        return ::testing::AssertionFailure()
            << what << ": " << actual.size() << " elements, expected " << expected.size();
    }
    MismatchLog log;
    for (size_t i = 0; i < expected.size(); ++i)
    {
        if (actual[i] != expected[i])
        {
            auto const at = static_cast<int64_t>(i);
            int64_t const inHalf = at % ml.halfElems;
            log.check(actual, at, expected[i], what,
                {at / ml.halfElems, inHalf / ml.pageElems, inHalf / ml.tokenElems % tokensPerPage,
                    inHalf / ml.headDim % ml.numKVHeads, inHalf % ml.headDim});
        }
    }
    if (log.count() != 0)
    {
        return ::testing::AssertionFailure()
            << what << ": " << log.count() << " element(s) differ; first " << log.first();
    }
    return ::testing::AssertionSuccess();
}

//! Returns success when every element (kv, slot, position, head, dim) of `layer`'s separate K (and V) views over
//! `host` (the layer's downloaded buffer) is `expectedAt(kv, slot, position, head, dim)`; checks a latent layer's V
//! view is empty.
template <typename Bits, typename ExpectedAt>
::testing::AssertionResult separateViewsHold(rt::KVCacheManager const& manager, LayoutModel const& model, int32_t layer,
    std::vector<Bits> const& host, ExpectedAt&& expectedAt)
{
    ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
    void const* base = manager.kPoolPtr(layer);
    std::pair<rt::Tensor, rt::Tensor> const separate = manager.getSeparateKVCache(layer);
    if (ml.numHalves == 1 && (separate.second.rawPointer() != nullptr || separate.second.volume() != 0))
    {
        return ::testing::AssertionFailure() << "a latent layer's V view is not empty";
    }
    MismatchLog log;
    for (int64_t kv = 0; kv < ml.numHalves; ++kv)
    {
        ViewMap view;
        ::testing::AssertionResult const mapped =
            mapView(kv == 0 ? separate.first : separate.second, base, sizeof(Bits), 4, view);
        if (!mapped)
        {
            return mapped;
        }
        // Element i of the half's [batch, slotTokens, H, D] in row-major order.
        for (int64_t i = 0; i < model.maxBatchSize * ml.slotTokens * ml.tokenElems; ++i)
        {
            int64_t const dim = i % ml.headDim;
            int64_t const head = i / ml.headDim % ml.numKVHeads;
            int64_t const position = i / ml.tokenElems % ml.slotTokens;
            int64_t const slot = i / (ml.tokenElems * ml.slotTokens);
            int64_t const elem = view.start + slot * view.stride[0] + position * view.stride[1] + head * view.stride[2]
                + dim * view.stride[3];
            log.check(host, elem, static_cast<Bits>(expectedAt(kv, slot, position, head, dim)),
                kv == 0 ? "separate K view" : "separate V view", {kv, slot, position, head, dim});
        }
    }
    if (log.count() != 0)
    {
        return ::testing::AssertionFailure() << log.count() << " element(s) differ; first " << log.first();
    }
    return ::testing::AssertionSuccess();
}

//! Returns what `layer`'s buffer holds, in the model's dense pool order, after its rings were written with `salt`:
//! at each slot's ring positions the last token to land there, found through the model's slotPosition; poison at
//! positions no token reached and on the pages beyond the slots'.
template <typename Bits>
std::vector<Bits> expectedAfterRings(LayoutModel const& model, int32_t layer, uint64_t salt)
{
    ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
    std::vector<Bits> expected(static_cast<size_t>(ml.numHalves * ml.halfElems), poisonBits<Bits>());
    for (int64_t kv = 0; kv < ml.numHalves; ++kv)
    {
        for (int64_t slot = 0; slot < model.maxBatchSize; ++slot)
        {
            for (int64_t position = 0; position < ml.slotTokens; ++position)
            {
                int64_t const token = tokenAt(position, tokensWritten(ml, slot), ml.slotTokens);
                if (token < 0)
                {
                    continue;
                }
                std::pair<int64_t, int64_t> const at = model.slotPosition(layer, slot, token);
                for (int64_t head = 0; head < ml.numKVHeads; ++head)
                {
                    for (int64_t dim = 0; dim < ml.headDim; ++dim)
                    {
                        int64_t const byte = model.poolByteOffset(layer, kv, at.first, at.second, head, dim);
                        expected[static_cast<size_t>(byte / model.elementBytes)] =
                            elementValue<Bits>(salt, kv, slot, token, head, dim);
                    }
                }
            }
        }
    }
    return expected;
}

//! Checks, group by group, what poisonAndWriteRings left: the pool view's bytes at the model's offsets, every pool
//! element read through LayerRef in a kernel, and the separate views.
template <typename Bits>
void checkRings(rt::KVCacheManager& manager, LayoutModel const& model, uint64_t saltBase, cudaStream_t stream)
{
    DeviceArray<unsigned long long> outside(1);
    outside.fillBytes(0, stream);
    for (ModelGroup const& group : model.groups)
    {
        for (int32_t const layer : group.layers)
        {
            SCOPED_TRACE(whereIs(model, layer));
            ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
            uint64_t const salt = saltBase + static_cast<uint64_t>(layer);
            std::vector<Bits> const expected = expectedAfterRings<Bits>(model, layer, salt);
            rt::Tensor const& pool = manager.getCombinedKVCachePoolView(layer);
            ASSERT_EQ(pool.rawPointer(), manager.kPoolPtr(layer));
            std::vector<Bits> const host =
                downloadElements<Bits>(pool.rawPointer(), ml.numHalves * ml.halfElems, stream);
            EXPECT_TRUE(samePoolElements(host, expected, ml, model.tokensPerPage, "pool view"));
            EXPECT_TRUE(samePoolElements(readThroughLayerRef<Bits>(manager, model, layer, stream, outside.get()),
                expected, ml, model.tokensPerPage, "LayerRef"));
            EXPECT_TRUE(separateViewsHold(manager, model, layer, host,
                [&](int64_t kv, int64_t slot, int64_t position, int64_t head, int64_t dim)
                {
                    int64_t const token = tokenAt(position, tokensWritten(ml, slot), ml.slotTokens);
                    return token < 0 ? poisonBits<Bits>() : elementValue<Bits>(salt, kv, slot, token, head, dim);
                }));
        }
    }
    EXPECT_EQ(outside.download(stream)[0], 0u) << "LayerRef reads computed addresses outside the layer";
}

//! Writes the rings of a hybrid cache of `type` with `numPagesPerGroup` through `writer`'s views (salt saltBase +
//! layer) and checks them through every view.
template <typename Bits>
void ringRoundTrip(rt::DataType type, std::vector<int32_t> numPagesPerGroup, SlotWriter writer, uint64_t saltBase)
{
    HybridCache hybrid(type, std::move(numPagesPerGroup));
    cudaStream_t const stream = hybrid.stream.get();
    expectExactBuffers(hybrid.manager, hybrid.model);
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteRings<Bits>(hybrid.manager, hybrid.model, writer, saltBase, stream, hybrid.outside.get()));
    ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(hybrid.outside.get(), stream));
    checkRings<Bits>(hybrid.manager, hybrid.model, saltBase, stream);
}

TYPED_TEST(HybridViewsTest, RingsWrittenThroughSeparateViewsReadBackThroughPoolViewAndLayerRef)
{
    // Every group retains pages beyond its slots', which must keep their poison; the slot view is refused.
    ringRoundTrip<typename TypeParam::Bits>(TypeParam::value, kRETAINED_PAGES, SlotWriter::kSEPARATE_VIEWS, 0x300);
}

TYPED_TEST(HybridViewsTest, RingsWrittenThroughTheSlotViewReadBackThroughEveryOtherView)
{
    ringRoundTrip<typename TypeParam::Bits>(TypeParam::value, {}, SlotWriter::kCOMBINED_VIEW, 0x400);
}

TYPED_TEST(HybridViewsTest, LayerRefWritesReadBackThroughSeparateAndPoolViews)
{
    using Bits = typename TypeParam::Bits;
    constexpr uint64_t kSALT = 0x500;
    HybridCache hybrid(TypeParam::value, kRETAINED_PAGES);
    LayoutModel const& model = hybrid.model;
    rt::KVCacheManager& manager = hybrid.manager;
    cudaStream_t const stream = hybrid.stream.get();
    expectExactBuffers(manager, model);
    ASSERT_NO_FATAL_FAILURE(poisonLayers(manager, model, stream));
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        layerRefPoolKernel<Bits, true>
            <<<gridFor(ml.numHalves * ml.halfElems), kBLOCK_SIZE, 0, stream>>>(manager.layerRef(layer),
                modelPools(manager, model, layer), kSALT + static_cast<uint64_t>(layer), nullptr, hybrid.outside.get());
        KVCACHE_TEST_CUDA(cudaGetLastError());
    }
    ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(hybrid.outside.get(), stream));

    for (ModelGroup const& group : model.groups)
    {
        for (int32_t const layer : group.layers)
        {
            SCOPED_TRACE(whereIs(model, layer));
            ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
            uint64_t const salt = kSALT + static_cast<uint64_t>(layer);
            // Every element of every page, retained pages included, at the model's offset.
            std::vector<Bits> expected(static_cast<size_t>(ml.numHalves * ml.halfElems));
            for (int64_t kv = 0; kv < ml.numHalves; ++kv)
            {
                for (int64_t page = 0; page < ml.numPages; ++page)
                {
                    for (int64_t token = 0; token < model.tokensPerPage; ++token)
                    {
                        for (int64_t head = 0; head < ml.numKVHeads; ++head)
                        {
                            for (int64_t dim = 0; dim < ml.headDim; ++dim)
                            {
                                int64_t const byte = model.poolByteOffset(layer, kv, page, token, head, dim);
                                expected[static_cast<size_t>(byte / model.elementBytes)] =
                                    elementValue<Bits>(salt, kv, page, token, head, dim);
                            }
                        }
                    }
                }
            }
            std::vector<Bits> const host = downloadElements<Bits>(
                manager.getCombinedKVCachePoolView(layer).rawPointer(), ml.numHalves * ml.halfElems, stream);
            EXPECT_TRUE(samePoolElements(host, expected, ml, model.tokensPerPage, "pool view"));
            EXPECT_EQ(std::count(host.begin(), host.end(), poisonBits<Bits>()), 0) << "elements LayerRef never reached";
            // Slot position p of slot b is token p % P of page b * pagesPerSequence + p / P: the model's slotPosition.
            EXPECT_TRUE(separateViewsHold(manager, model, layer, host,
                [&](int64_t kv, int64_t slot, int64_t position, int64_t head, int64_t dim)
                {
                    std::pair<int64_t, int64_t> const at = model.slotPosition(layer, slot, position);
                    return elementValue<Bits>(salt, kv, at.first, at.second, head, dim);
                }));
        }
    }
}

} // namespace
} // namespace kvcache::test
