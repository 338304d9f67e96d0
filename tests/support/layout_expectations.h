#pragma once

// GoogleTest expectations of a page group's and a layer's layout against the independent model, and of two LayerRefs
// (the library's and the model's) against each other.

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/layer_ref.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <string>

#include "support/layout_model.h"

namespace kvcache::test
{

//! Expects every field of `group` to be what the model says of group `index`.
inline void expectGroupMatchesModel(rt::KVPageGroupLayout const& group, LayoutModel const& model, size_t index)
{
    SCOPED_TRACE("group " + std::to_string(index));
    ModelGroup const& expected = model.groups.at(index);
    EXPECT_EQ(group.slidingWindow, expected.slidingWindow);
    EXPECT_EQ(group.pagesPerSequence, expected.pagesPerSequence);
    EXPECT_EQ(group.slotTokens, expected.pagesPerSequence * model.tokensPerPage);
    EXPECT_EQ(group.minPages, expected.minPages);
    EXPECT_EQ(group.numPages, expected.numPages);
    EXPECT_EQ(group.layers, expected.layers);
    EXPECT_EQ(group.bytesPerPage, expected.bytesPerPage);
    int64_t groupBytes = 0;
    for (int32_t const layer : expected.layers)
    {
        groupBytes += model.layers[static_cast<size_t>(layer)].layerBytes;
    }
    EXPECT_EQ(group.cacheBytes, groupBytes);
}

//! Expects every field of `layer` to be what the model says of layer `index`.
inline void expectLayerMatchesModel(rt::KVLayerLayout const& layer, LayoutModel const& model, size_t index)
{
    SCOPED_TRACE("layer " + std::to_string(index));
    ModelLayer const& expected = model.layers.at(index);
    EXPECT_EQ(layer.numKVHeads, expected.numKVHeads);
    EXPECT_EQ(layer.headDim, expected.headDim);
    EXPECT_EQ(layer.slidingWindow, expected.slidingWindow);
    EXPECT_EQ(layer.group, expected.group);
    EXPECT_EQ(layer.numHalves, expected.numHalves);
    EXPECT_EQ(layer.slotTokens, expected.slotTokens);
    EXPECT_EQ(layer.numPages, expected.numPages);
    EXPECT_EQ(layer.pageElems, expected.pageElems);
    EXPECT_EQ(layer.pageBytes, expected.pageBytes);
    EXPECT_EQ(layer.halfElems, expected.halfElems);
    EXPECT_EQ(layer.layerBytes, expected.layerBytes);
}

//! Expects every field of `layout` (the whole cache, each group, each layer) to be what the model says.
inline void expectLayoutMatchesModel(rt::KVCacheLayout const& layout, LayoutModel const& model)
{
    int64_t const scalars[] = {layout.capPadded, layout.pagesPerSlot, layout.minPages, layout.numPages,
        layout.cacheBytes, layout.bytesPerPage};
    int64_t const expectedScalars[] = {
        model.capPadded, model.pagesPerSlot, model.minPages, model.numPages, model.cacheBytes, model.bytesPerPage};
    char const* const names[] = {"capPadded", "pagesPerSlot", "minPages", "numPages", "cacheBytes", "bytesPerPage"};
    for (size_t i = 0; i < std::size(names); ++i)
    {
        EXPECT_EQ(scalars[i], expectedScalars[i]) << names[i];
    }
    ASSERT_EQ(layout.groups.size(), model.groups.size());
    for (size_t g = 0; g < model.groups.size(); ++g)
    {
        expectGroupMatchesModel(layout.groups[g], model, g);
    }
    ASSERT_EQ(layout.layers.size(), model.layers.size());
    for (size_t i = 0; i < model.layers.size(); ++i)
    {
        expectLayerMatchesModel(layout.layers[i], model, i);
    }
}

//! Returns success when `actual` and `expected` hold the same pointers and fields; names the first that differs.
inline ::testing::AssertionResult sameLayerRef(rt::LayerRef const& actual, rt::LayerRef const& expected)
{
    auto const address = [](void const* pointer) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(pointer)); };
    struct Field
    {
        char const* name;
        int64_t actual;
        int64_t expected;
    };
    Field const fields[] = {
        {"kPool", address(actual.kPool), address(expected.kPool)},
        {"vPool", address(actual.vPool), address(expected.vPool)},
        {"pageStride", actual.pageStride, expected.pageStride},
        {"tokenStride", actual.tokenStride, expected.tokenStride},
        {"headStride", actual.headStride, expected.headStride},
        {"elementBytes", actual.elementBytes, expected.elementBytes},
        {"numPages", actual.numPages, expected.numPages},
        {"tokensPerPage", actual.tokensPerPage, expected.tokensPerPage},
        {"numKVHeads", actual.numKVHeads, expected.numKVHeads},
        {"headDim", actual.headDim, expected.headDim},
        {"kScalePool", address(actual.kScalePool), address(expected.kScalePool)},
        {"vScalePool", address(actual.vScalePool), address(expected.vScalePool)},
        {"scalesPerHead", actual.scalesPerHead, expected.scalesPerHead},
        {"scaleElementBytes", actual.scaleElementBytes, expected.scaleElementBytes},
    };
    for (Field const& field : fields)
    {
        if (field.actual != field.expected)
        {
            return ::testing::AssertionFailure()
                << "LayerRef::" << field.name << " is " << field.actual << ", expected " << field.expected;
        }
    }
    return ::testing::AssertionSuccess();
}

} // namespace kvcache::test
