#pragma once

// Helpers the plan's maths (plan.cpp), text (plan_text.cpp) and JSON (plan_json.cpp) share; text_format.cpp has them.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache::plan::detail
{

//! Returns ascending indices as text: "0-31", "3, 7, ..., 47" for an evenly spaced run, else runs like "0-3, 8".
std::string formatRuns(std::vector<int32_t> const& indices);

//! Returns ascending indices as text, as formatRuns does, or as "0-61 except 5, 11, ..., 59" when that is shorter.
std::string formatIndices(std::vector<int32_t> const& indices);

//! Returns a view shape as text, e.g. "[2, 512, 128, 8, 128]".
std::string formatShape(std::array<int64_t, 5> const& dims);

//! Returns `text` broken into lines of at most `width` characters at spaces, the first after `first` and the others
//! after `indent`, each ending in a newline.
std::string wrapText(std::string_view text, std::string_view first, std::string_view indent, size_t width);

//! Returns part / whole as a percentage with one decimal, e.g. "35.9%".
std::string formatPercent(int64_t part, int64_t whole);

//! A table of text cells; columns flagged in `rightAligned` are aligned right.
class TextTable
{
public:
    //! Starts the table with its header row.
    TextTable(std::vector<std::string> header, std::vector<bool> rightAligned);

    //! Adds a row of as many cells as the header.
    void addRow(std::vector<std::string> row);

    //! Returns the rows, each after `indent`, with a rule under the header and columns padded to their widest cell.
    std::string render(std::string_view indent) const;

private:
    std::string renderRow(
        std::string_view indent, std::vector<std::string> const& row, std::vector<size_t> const& widths) const;

    std::vector<bool> mRightAligned;
    std::vector<std::vector<std::string>> mRows;
};

//! Returns whether some layer of `config` has a sliding window.
inline bool hasWindows(rt::KVCacheConfig const& config)
{
    return std::any_of(config.layerConfigs.begin(), config.layerConfigs.end(),
        [](rt::KVLayerConfig const& layer) { return layer.slidingWindow > 0; });
}

//! Returns whether some layer of `config` is a latent (K only) layer.
inline bool hasLatentLayers(rt::KVCacheConfig const& config)
{
    return std::any_of(config.layerConfigs.begin(), config.layerConfigs.end(),
        [](rt::KVLayerConfig const& layer) { return layer.kind == rt::KVLayerKind::kLATENT; });
}

//! Returns the bytes of every layer's scale pool together: the part of cacheBytes that scales take (0 unquantized).
inline int64_t totalScaleBytes(rt::KVCacheLayout const& layout)
{
    int64_t bytes = 0;
    for (rt::KVLayerLayout const& layer : layout.layers)
    {
        bytes += layer.scaleBytes;
    }
    return bytes;
}

//! Returns the attention bytes of one token over every attention layer, data and scales: each group's bytesPerPage
//! over tokensPerPage (a page id holds tokensPerPage tokens of each of the group's layers).
inline int64_t attentionBytesPerToken(rt::KVCacheLayout const& layout)
{
    int64_t bytes = 0;
    for (rt::KVPageGroupLayout const& group : layout.groups)
    {
        bytes += group.bytesPerPage / layout.tokensPerPage;
    }
    return bytes;
}

//! Returns the bytes one (token, head) of one half of `layer` takes, data and scales: the per-format figure
//! (float16 2D, fp8 D, fp8 per token-head D + 4, NVFP4 D/2 + D/16), from the layout's page sizes.
inline int64_t bytesPerTokenHeadHalf(rt::KVCacheLayout const& layout, rt::KVLayerLayout const& layer)
{
    return (layer.pageBytes + layer.scalePageBytes) / (int64_t{layout.tokensPerPage} * layer.numKVHeads);
}

} // namespace kvcache::plan::detail
