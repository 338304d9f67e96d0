#pragma once

// The page-op tests' host model of a cache: every layer's bytes, and its scale pool's, with copies and resets applied
// as the documentation says they act (support/page_op_reference.h puts it beside a real cache).

#include "kvcache/memory/page_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "support/layout_model.h"

namespace kvcache::test
{

//! Returns byte `index` of a page filled with the little-endian 4-byte `pattern`, counted from the page's start.
inline uint8_t patternByte(uint32_t pattern, int64_t index)
{
    return static_cast<uint8_t>(pattern >> (8 * (index % 4)));
}

//! Host model of every layer's buffer: the K pool, then (unless the layer is latent) the V pool, each of its group's
//! numPages pages of P * H * D elements, sized by the tests' own layout model; and, for a cache with scale pools, of
//! every layer's scale pool, laid out the same way with scale pages (a page op moves a page's scales with its data).
//! Operations act on one page group, as PageOpTarget names it: layers are positions in the group's list, ids index the
//! group's pages.
class ReferenceCache
{
public:
    explicit ReferenceCache(rt::KVCacheConfig const& config)
        : mModel(modelLayout(config))
    {
        for (ModelLayer const& layer : mModel.layers)
        {
            mBytes.emplace_back(static_cast<size_t>(layer.layerBytes));
            mScales.emplace_back(static_cast<size_t>(layer.scaleBytes));
        }
    }

    //! Returns the number of layers.
    int32_t numLayers() const noexcept
    {
        return static_cast<int32_t>(mBytes.size());
    }
    //! Returns the pages per half of group 0's layers (of every layer when there is one group).
    int32_t numPages() const noexcept
    {
        return static_cast<int32_t>(mModel.numPages);
    }
    //! Returns the pages per half of the layers of page group `group`.
    int32_t numPages(int32_t group) const
    {
        return static_cast<int32_t>(mModel.groups.at(static_cast<size_t>(group)).numPages);
    }
    //! Returns the halves of `layer`: 2, or 1 for a latent layer.
    int32_t numHalves(int32_t layer) const
    {
        return static_cast<int32_t>(mModel.layers.at(static_cast<size_t>(layer)).numHalves);
    }
    //! Returns the layout model the reference is sized by.
    LayoutModel const& model() const noexcept
    {
        return mModel;
    }
    //! Returns tokensPerPage * H * D * element size of `layer`.
    int64_t pageBytes(int32_t layer) const
    {
        return mModel.layers.at(static_cast<size_t>(layer)).pageBytes;
    }
    //! Returns the bytes of one half (K or V) of `layer`.
    int64_t halfBytes(int32_t layer) const
    {
        return mModel.layers.at(static_cast<size_t>(layer)).halfBytes;
    }
    //! Returns the bytes of the whole buffer of `layer`.
    int64_t layerBytes(int32_t layer) const
    {
        return mModel.layers.at(static_cast<size_t>(layer)).layerBytes;
    }
    //! Returns the modelled buffer of `layer`.
    std::vector<uint8_t>& bytes(int32_t layer)
    {
        return mBytes.at(static_cast<size_t>(layer));
    }
    //! Returns the first byte of page `id` of half `kv` (0 is K, 1 is V) of `layer`; the caller keeps kv below
    //! numHalves(layer) and id below the layer's pages.
    uint8_t* page(int32_t layer, int32_t kv, int32_t id)
    {
        return bytes(layer).data() + kv * halfBytes(layer) + id * pageBytes(layer);
    }
    //! Returns true when the layers have scale pools.
    bool hasScales() const
    {
        return !mModel.layers.empty() && mModel.layers.front().scaleBytes > 0;
    }
    //! Returns the scale bytes of one page of one half of `layer` (0 without scale pools).
    int64_t scalePageBytes(int32_t layer) const
    {
        return mModel.layers.at(static_cast<size_t>(layer)).scalePageBytes;
    }
    //! Returns the modelled scale pool of `layer` (empty without scale pools).
    std::vector<uint8_t>& scales(int32_t layer)
    {
        return mScales.at(static_cast<size_t>(layer));
    }
    //! Returns the first byte of scale page `id` of half `kv` of `layer`, as page() does for data.
    uint8_t* scalePage(int32_t layer, int32_t kv, int32_t id)
    {
        ModelLayer const& m = mModel.layers.at(static_cast<size_t>(layer));
        return scales(layer).data() + kv * m.scaleHalfBytes + id * m.scalePageBytes;
    }

    //! Fills every buffer with pseudo-random non-zero bytes; the first byte of each page of a layer is distinct (for
    //! up to 255 pages of its halves together), so no copy can go unseen because source and destination were equal.
    void fillRandom(std::mt19937_64& rng)
    {
        for (std::vector<std::vector<uint8_t>>* const pools : {&mBytes, &mScales})
        {
            for (std::vector<uint8_t>& layer : *pools)
            {
                // Eight bytes from each draw: the large-page tests model over 80 MB.
                uint64_t bits = 0;
                for (size_t i = 0; i < layer.size(); ++i)
                {
                    bits = i % 8 == 0 ? rng() : bits >> 8;
                    layer[i] = static_cast<uint8_t>(1 + (bits & 0xFFU) % 255);
                }
            }
        }
        uint64_t const salt = rng();
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            int32_t const layerPages = pagesOf(layer);
            for (int32_t kv = 0; kv < numHalves(layer); ++kv)
            {
                for (int32_t id = 0; id < layerPages; ++id)
                {
                    uint64_t const index = static_cast<uint64_t>(kv) * static_cast<uint64_t>(layerPages) + id;
                    page(layer, kv, id)[0] = static_cast<uint8_t>(1 + (salt + index * 37) % 255);
                    if (scalePageBytes(layer) > 0)
                    {
                        // Offset from the data's salt, so a scale page copied from a data page would not match.
                        scalePage(layer, kv, id)[0] = static_cast<uint8_t>(1 + (salt + 101 + index * 37) % 255);
                    }
                }
            }
        }
    }

    //! Applies `pairs` to the targeted group's layers and halves (group -1: group 0), skipping any pair with an id
    //! outside the group's [0, numPages).
    void copy(std::vector<rt::PageCopy> const& pairs, rt::PageOpTarget const& target = {})
    {
        forEachTargetedHalf(target,
            [&](int32_t layer, int32_t kv)
            {
                for (rt::PageCopy const& pair : pairs)
                {
                    if (isPage(layer, pair.src) && isPage(layer, pair.dst))
                    {
                        std::memcpy(page(layer, kv, pair.dst), page(layer, kv, pair.src),
                            static_cast<size_t>(pageBytes(layer)));
                        std::memcpy(scalePage(layer, kv, pair.dst), scalePage(layer, kv, pair.src),
                            static_cast<size_t>(scalePageBytes(layer)));
                    }
                }
            });
    }

    //! Fills `pages` with `pattern` in the targeted group's layers and halves, skipping ids outside the group's
    //! [0, numPages).
    void reset(std::vector<int32_t> const& pages, uint32_t pattern, rt::PageOpTarget const& target = {})
    {
        forEachTargetedHalf(target,
            [&](int32_t layer, int32_t kv)
            {
                for (int32_t const id : pages)
                {
                    if (isPage(layer, id))
                    {
                        uint8_t* const first = page(layer, kv, id);
                        for (int64_t i = 0; i < pageBytes(layer); ++i)
                        {
                            first[i] = patternByte(pattern, i);
                        }
                        // Scale pages take the pattern from their own first byte (page_ops.h).
                        uint8_t* const firstScale = scalePage(layer, kv, id);
                        for (int64_t i = 0; i < scalePageBytes(layer); ++i)
                        {
                            firstScale[i] = patternByte(pattern, i);
                        }
                    }
                }
            });
    }

private:
    int32_t pagesOf(int32_t layer) const
    {
        return static_cast<int32_t>(mModel.layers.at(static_cast<size_t>(layer)).numPages);
    }
    bool isPage(int32_t layer, int32_t id) const
    {
        return id >= 0 && id < pagesOf(layer);
    }

    //! Visits (layer, half) for every targeted layer of the targeted group; a latent layer has no V half, so kV skips
    //! it and kBOTH visits its K half alone.
    template <typename Visit>
    void forEachTargetedHalf(rt::PageOpTarget const& target, Visit&& visit)
    {
        if (mModel.groups.empty())
        {
            return;
        }
        std::vector<int32_t> const& layers = mModel.groups.at(static_cast<size_t>(std::max(target.group, 0))).layers;
        auto const groupSize = static_cast<int32_t>(layers.size());
        int32_t const count = target.numLayers < 0 ? groupSize - target.firstLayer : target.numLayers;
        for (int32_t position = target.firstLayer; position < target.firstLayer + count; ++position)
        {
            int32_t const layer = layers.at(static_cast<size_t>(position));
            if (target.half != rt::KVHalf::kV)
            {
                visit(layer, 0);
            }
            if (target.half != rt::KVHalf::kK && numHalves(layer) == 2)
            {
                visit(layer, 1);
            }
        }
    }

    LayoutModel mModel;
    std::vector<std::vector<uint8_t>> mBytes;
    std::vector<std::vector<uint8_t>> mScales; //!< one a layer, empty without scale pools
};

} // namespace kvcache::test
