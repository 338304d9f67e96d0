#include "plan.h"
#include "plan_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>

namespace kvcache::plan
{
namespace
{

using detail::formatIndices;
using detail::formatPercent;
using detail::formatShape;
using detail::hasLatentLayers;
using detail::hasWindows;
using detail::TextTable;
using detail::wrapText;

//! How cache layer `i` attends, for a table cell: "full", "sliding 128", "chunked 8192".
std::string attentionCell(Plan const& plan, size_t i)
{
    AttentionKind const kind = plan.model.attentionKinds[i];
    int32_t const window = plan.config.layerConfigs[i].slidingWindow;
    return window == 0 ? std::string(attentionKindName(kind)) : fmt::format("{} {}", attentionKindName(kind), window);
}

//! The head shape of cache layer `i`, for a table cell: "8 x 128", or "1 x 576 latent".
std::string shapeCell(rt::KVLayerLayout const& layer)
{
    return fmt::format(
        "{} x {}{}", layer.numKVHeads, layer.headDim, layer.kind == rt::KVLayerKind::kLATENT ? " latent" : "");
}

//! One line: how many cache layers attend how, e.g. "12 full, 12 sliding (window 128)".
std::string attentionSummary(Plan const& plan)
{
    std::vector<std::pair<std::string, int32_t>> counts;
    for (size_t i = 0; i < plan.config.layerConfigs.size(); ++i)
    {
        AttentionKind const kind = plan.model.attentionKinds[i];
        int32_t const window = plan.config.layerConfigs[i].slidingWindow;
        std::string const label = kind == AttentionKind::kFULL ? "full"
            : kind == AttentionKind::kSLIDING                  ? fmt::format("sliding (window {})", window)
                                                               : fmt::format("chunked (chunks of {})", window);
        auto const it =
            std::find_if(counts.begin(), counts.end(), [&](auto const& count) { return count.first == label; });
        if (it == counts.end())
        {
            counts.emplace_back(label, 1);
        }
        else
        {
            ++it->second;
        }
    }
    std::string text;
    for (auto const& [label, count] : counts)
    {
        text += fmt::format("{}{} {}", text.empty() ? "" : ", ", count, label);
    }
    int64_t const numLatent = std::count_if(plan.config.layerConfigs.begin(), plan.config.layerConfigs.end(),
        [](rt::KVLayerConfig const& layer) { return layer.kind == rt::KVLayerKind::kLATENT; });
    if (numLatent > 0)
    {
        text += numLatent == static_cast<int64_t>(plan.config.layerConfigs.size())
            ? "; all latent (one vector per token, K only)"
            : fmt::format("; {} latent (one vector per token, K only)", numLatent);
    }
    return text;
}

//! The table of page groups, for a plan with more than one.
std::string formatGroupTable(Plan const& plan)
{
    rt::KVCacheLayout const& layout = plan.layout;
    TextTable table({"group", "attention", "layers", "pages/seq", "slot tokens", "pages", "bytes per page", "bytes"},
        {false, false, false, true, true, true, true, true});
    for (size_t g = 0; g < layout.groups.size(); ++g)
    {
        rt::KVPageGroupLayout const& group = layout.groups[g];
        bool const allChunked = !group.layers.empty()
            && std::all_of(group.layers.begin(), group.layers.end(),
                [&](int32_t layer)
                { return plan.model.attentionKinds[static_cast<size_t>(layer)] == AttentionKind::kCHUNKED; });
        std::string const attention = group.slidingWindow == 0 ? "full"
            : allChunked                                       ? fmt::format("chunks of {}", group.slidingWindow)
                                                               : fmt::format("window {}", group.slidingWindow);
        table.addRow({fmt::format("{}", g), attention, group.layers.empty() ? "none" : formatIndices(group.layers),
            formatBytes(group.pagesPerSequence), formatBytes(group.slotTokens), formatBytes(group.numPages),
            formatBytes(group.bytesPerPage),
            fmt::format("{} ({})", formatBytes(group.cacheBytes), formatSize(group.cacheBytes))});
    }
    return table.render("    ");
}

std::string formatLayerTable(Plan const& plan, bool perLayer)
{
    rt::KVCacheLayout const& layout = plan.layout;
    bool const hybrid = plan.model.numModelLayers != static_cast<int32_t>(plan.model.layers.size());
    bool const windows = hasWindows(plan.config);
    bool const groups = layout.groups.size() > 1;
    std::vector<std::string> header = {perLayer ? "layer" : "layers"};
    std::vector<bool> rightAligned = {false};
    auto const addColumn = [&](std::string name, bool right)
    {
        header.push_back(std::move(name));
        rightAligned.push_back(right);
    };
    if (hybrid)
    {
        addColumn(perLayer ? "model layer" : "model layers", false);
    }
    if (windows)
    {
        addColumn("attention", false);
    }
    addColumn("H x D", false);
    if (groups)
    {
        addColumn("group", true);
    }
    addColumn("slot view", false);
    addColumn("pool view", false);
    addColumn(perLayer ? "bytes" : "bytes per layer", true);
    if (!perLayer)
    {
        addColumn("bytes", true);
    }
    TextTable table(std::move(header), std::move(rightAligned));

    // Rows: sets of identical layers (shape, kind, attention, group), in order of their first layer.
    size_t const numLayers = layout.layers.size();
    auto const sameRow = [&](size_t a, size_t b)
    {
        rt::KVLayerLayout const& x = layout.layers[a];
        rt::KVLayerLayout const& y = layout.layers[b];
        return x.numKVHeads == y.numKVHeads && x.headDim == y.headDim && x.kind == y.kind
            && x.slidingWindow == y.slidingWindow && x.group == y.group && x.slotTokens == y.slotTokens
            && x.numPages == y.numPages && plan.model.attentionKinds[a] == plan.model.attentionKinds[b];
    };
    std::vector<bool> placed(numLayers, false);
    for (size_t first = 0; first < numLayers; ++first)
    {
        if (placed[first])
        {
            continue;
        }
        std::vector<int32_t> cacheLayers;
        std::vector<int32_t> modelLayers;
        for (size_t i = first; i < numLayers && (i == first || !perLayer); ++i)
        {
            if (!placed[i] && sameRow(first, i))
            {
                placed[i] = true;
                cacheLayers.push_back(static_cast<int32_t>(i));
                modelLayers.push_back(plan.model.attentionLayers[i]);
            }
        }
        rt::KVLayerLayout const& layer = layout.layers[first];
        std::vector<std::string> row = {formatIndices(cacheLayers)};
        if (hybrid)
        {
            row.push_back(formatIndices(modelLayers));
        }
        if (windows)
        {
            row.push_back(attentionCell(plan, first));
        }
        row.push_back(shapeCell(layer));
        if (groups)
        {
            row.push_back(fmt::format("{}", layer.group));
        }
        // Views have the stored last dimension (D / 2 bytes for NVFP4); a layer's bytes count its scale pool too, so
        // that the rows add up to the total.
        row.push_back(formatShape(
            {layer.numHalves, plan.config.maxBatchSize, layer.slotTokens, layer.numKVHeads, layer.storedDim}));
        row.push_back(
            formatShape({layer.numHalves, layer.numPages, layout.tokensPerPage, layer.numKVHeads, layer.storedDim}));
        int64_t const bytes = layer.layerBytes + layer.scaleBytes;
        row.push_back(formatBytes(bytes));
        if (!perLayer)
        {
            int64_t const rowBytes = static_cast<int64_t>(cacheLayers.size()) * bytes;
            row.push_back(fmt::format("{} ({})", formatBytes(rowBytes), formatSize(rowBytes)));
        }
        table.addRow(std::move(row));
    }
    return table.render("  ");
}

//! Returns "conv [8192, 3] bfloat16, recurrent [32, 128, 128] float32": a state layer's tensors.
std::string stateTensorsText(rt::StateLayerLayout const& layer)
{
    std::string text;
    for (rt::StateTensorLayout const& tensor : layer.tensors)
    {
        text += fmt::format("{}{} [{}] {}", text.empty() ? "" : ", ", tensor.name, fmt::join(tensor.shape, ", "),
            rt::dataTypeName(tensor.dataType));
    }
    return text;
}

//! The "state" lines: each set of state layers of one kind and shape, their bytes per sequence and the slots.
std::string formatState(Plan const& plan)
{
    rt::KVCacheLayout const& layout = plan.layout;
    std::vector<StateLayerDescription> const& described = plan.model.stateLayers;
    std::string text;
    std::vector<bool> done(described.size(), false);
    for (size_t i = 0; i < described.size(); ++i)
    {
        if (done[i])
        {
            continue;
        }
        std::string const tensors = stateTensorsText(layout.stateLayers[i]);
        std::vector<int32_t> modelLayers;
        for (size_t j = i; j < described.size(); ++j)
        {
            if (!done[j] && described[j].kind == described[i].kind
                && stateTensorsText(layout.stateLayers[j]) == tensors)
            {
                done[j] = true;
                modelLayers.push_back(described[j].modelLayer);
            }
        }
        int64_t const slotBytes = layout.stateLayers[i].slotBytes;
        text += wrapText(fmt::format("{} {} layers (model layers {}): {}; {} bytes a sequence each", modelLayers.size(),
                             described[i].kind, formatIndices(modelLayers), tensors, formatBytes(slotBytes)),
            text.empty() ? "  state     " : "            ", "              ", 118);
    }
    text += wrapText(
        fmt::format("{} bytes ({}) of state per sequence; {} slot{}, one a sequence of the batch: {} "
                    "bytes ({})",
            formatBytes(layout.stateBytesPerSlot), formatSize(layout.stateBytesPerSlot), layout.numStateSlots,
            layout.numStateSlots == 1 ? "" : "s", formatBytes(layout.stateBytes), formatSize(layout.stateBytes)),
        "            ", "              ", 118);
    return text;
}

std::string formatBudget(Plan const& plan)
{
    rt::KVCacheLayout const& layout = plan.layout;
    if (!plan.budgetBytes)
    {
        return "  budget    none given (--budget 40GiB shows the pages that fit)\n";
    }
    int64_t const budget = *plan.budgetBytes;
    std::string text = fmt::format("  budget    {} bytes ({})\n", formatBytes(budget), formatSize(budget));
    if (plan.budgetSplit)
    {
        rt::BudgetSplit const& split = *plan.budgetSplit;
        std::string pages;
        for (size_t g = 0; g < split.numPagesPerGroup.size(); ++g)
        {
            pages += fmt::format("{}group {} {} pages", g == 0 ? "" : ", ", g, formatBytes(split.numPagesPerGroup[g]));
        }
        std::string line = fmt::format("{} full-length sequences in every group: {} per layer half; {} bytes ({})",
            formatBytes(split.sequences), pages, formatBytes(split.bytes), formatSize(split.bytes));
        line += split.sequences >= plan.config.maxBatchSize ? fmt::format(", {:.2f}x batch {}",
                    static_cast<double>(split.sequences) / plan.config.maxBatchSize, plan.config.maxBatchSize)
                                                            : fmt::format("; below batch {}", plan.config.maxBatchSize);
        text += wrapText(line, "  fits      ", "            ", 118);
    }
    else
    {
        int64_t const sequences = plan.budgetPages / layout.pagesPerSlot;
        text += fmt::format("  fits      {} pages per layer half = {} full-length sequences",
            formatBytes(plan.budgetPages), formatBytes(sequences));
        if (plan.budgetPages >= layout.minPages)
        {
            text += fmt::format(" ({:.2f}x the minimum {})\n",
                static_cast<double>(plan.budgetPages) / static_cast<double>(layout.minPages),
                formatBytes(layout.minPages));
        }
        else
        {
            text += fmt::format(
                "; below the minimum {} pages for batch {}\n", formatBytes(layout.minPages), plan.config.maxBatchSize);
        }
    }
    if (layout.stateBytes > 0)
    {
        text += fmt::format("            after the state slots' {} bytes ({}), which the budget pays first\n",
            formatBytes(layout.stateBytes), formatSize(layout.stateBytes));
    }
    int64_t const planned = layout.cacheBytes + layout.stateBytes;
    if (planned > budget)
    {
        text += fmt::format("            the planned cache is {} bytes ({}) over the budget\n",
            formatBytes(planned - budget), formatSize(planned - budget));
    }
    return text;
}

//! The "step" line(s): what --step-tokens means for this plan.
std::string formatStep(Plan const& plan)
{
    int32_t const step = plan.config.maxTokensPerStep;
    if (!hasWindows(plan.config))
    {
        return step == 0 ? std::string{}
                         : fmt::format("  step      up to {} tokens per sequence per step (--step-tokens); no layer "
                                       "has a window, so it changes nothing\n",
                             formatBytes(step));
    }
    if (step != 0)
    {
        return fmt::format("  step      up to {} tokens per sequence per step (--step-tokens): a windowed layer keeps "
                           "window - 1 + {} tokens\n",
            formatBytes(step), formatBytes(step));
    }
    std::string line = "whole prompts in one step (--step-tokens 0): windowed layers keep full-length caches;";
    if (plan.stepSuggestion)
    {
        StepSuggestion const& suggestion = *plan.stepSuggestion;
        int64_t const saving = suggestion.currentBytes - suggestion.cacheBytes;
        line += saving > 0
            ? fmt::format(" --step-tokens {} would plan {} bytes ({}) for the minimum cache, saving {} bytes ({}, {})",
                suggestion.stepTokens, formatBytes(suggestion.cacheBytes), formatSize(suggestion.cacheBytes),
                formatBytes(saving), formatSize(saving), formatPercent(saving, suggestion.currentBytes))
            : fmt::format(" --step-tokens {} would save nothing here: every window still reaches the whole sequence",
                suggestion.stepTokens);
    }
    return wrapText(line, "  step      ", "            ", 118);
}

//! The "saving" line: what the windows save against full-length caches, when --step-tokens bounds them.
std::string formatSaving(Plan const& plan)
{
    if (!hasWindows(plan.config) || plan.config.maxTokensPerStep == 0)
    {
        return {};
    }
    int64_t const saving = plan.fullLengthBytes - plan.layout.cacheBytes;
    if (saving <= 0)
    {
        return wrapText(fmt::format("none: at this --seq-len and --step-tokens every window still reaches the whole "
                                    "sequence ({} bytes either way)",
                            formatBytes(plan.fullLengthBytes)),
            "  saving    ", "            ", 118);
    }
    return fmt::format("  saving    {} bytes ({}, {}) against full-length caches, {} bytes ({})\n", formatBytes(saving),
        formatSize(saving), formatPercent(saving, plan.fullLengthBytes), formatBytes(plan.fullLengthBytes),
        formatSize(plan.fullLengthBytes));
}

//! The "tp" lines of a --tp plan: how each layer is shared across the GPUs; every figure after them is per GPU.
std::string formatTensorParallel(Plan const& plan)
{
    if (!plan.shard)
    {
        return {};
    }
    rt::TensorParallelShard const& shard = *plan.shard;
    // Layers that share a row: the same model heads, kind and share.
    std::vector<std::pair<std::string, std::vector<int32_t>>> rows;
    for (size_t i = 0; i < shard.layers.size(); ++i)
    {
        rt::TensorParallelLayerShard const& layer = shard.layers[i];
        rt::KVLayerConfig const& modelLayer = plan.model.layers[i];
        std::string label;
        if (modelLayer.kind == rt::KVLayerKind::kLATENT)
        {
            label = "latent: the whole vector on every GPU (one per token, shared by all heads)";
        }
        else if (!layer.replicated)
        {
            label = fmt::format("{} of {} KV heads a GPU", layer.numHeads, modelLayer.numKVHeads);
        }
        else
        {
            label = fmt::format("{} KV head{} replicated: one a GPU, each on {} GPUs", modelLayer.numKVHeads,
                modelLayer.numKVHeads == 1 ? "" : "s", layer.replicas);
        }
        auto const it = std::find_if(rows.begin(), rows.end(), [&](auto const& row) { return row.first == label; });
        if (it == rows.end())
        {
            rows.emplace_back(label, std::vector<int32_t>{static_cast<int32_t>(i)});
        }
        else
        {
            it->second.push_back(static_cast<int32_t>(i));
        }
    }
    std::string text = fmt::format("  tp        {} GPUs (--tp); every figure below is one GPU's shard\n", shard.tp);
    for (auto const& [label, layers] : rows)
    {
        text +=
            wrapText(fmt::format("layers {}: {}", formatIndices(layers), label), "            ", "              ", 118);
    }
    return text;
}

//! The quantization line: the format, where its scales live and the bytes of one (token, head, half), or nothing for
//! an unquantized cache.
std::string formatQuantization(Plan const& plan)
{
    rt::KVCacheLayout const& layout = plan.layout;
    if (layout.quantization == rt::KVQuantization::kNONE || layout.layers.empty())
    {
        return {};
    }
    std::string_view scales;
    switch (layout.quantization)
    {
    case rt::KVQuantization::kFP8_PER_TENSOR:
        scales = "E4M3 values; one float32 K and one V scale a layer, kept on the host (no page bytes)";
        break;
    case rt::KVQuantization::kFP8_PER_TOKEN_HEAD:
        scales =
            "E4M3 values and a float32 scale a token and head: scale pool [halves, pages, tokensPerPage, H] per layer";
        break;
    default:
        scales =
            "E2M1 values two a byte and an E4M3 scale a 16 values: scale pool [halves, pages, tokensPerPage, H, D/16] "
            "per layer, plus a float32 global scale a layer half on the host";
        break;
    }
    rt::KVLayerLayout const& first = layout.layers.front();
    std::string line = fmt::format("{}: {}; {} bytes a token, head and half (layer 0, data and scales)",
        rt::kvQuantizationName(layout.quantization), scales, detail::bytesPerTokenHeadHalf(layout, first));
    return wrapText(line, "  quant     ", "            ", 118);
}

} // namespace

std::string formatPlan(Plan const& plan, bool perLayer)
{
    rt::KVCacheLayout const& layout = plan.layout;
    ModelDescription const& model = plan.model;
    int32_t const numCacheLayers = static_cast<int32_t>(layout.layers.size());
    bool const latent = hasLatentLayers(plan.config);
    std::string text = fmt::format("kvcache plan: {}\n\n", model.name);

    text += fmt::format("  layers    {} attention layers", numCacheLayers);
    text += numCacheLayers == model.numModelLayers
        ? "\n"
        : fmt::format(" of {}: model layers {}\n", model.numModelLayers, formatIndices(model.attentionLayers));
    if (hasWindows(plan.config) || latent)
    {
        text += fmt::format("  attention {}\n", attentionSummary(plan));
    }
    if (!layout.stateLayers.empty())
    {
        text += formatState(plan);
    }
    for (size_t i = 0; i < model.notes.size(); ++i)
    {
        text += wrapText(model.notes[i], i == 0 ? "  read      " : "            ", "              ", 118);
    }
    text += fmt::format("  cache     {} ({} byte{}), batch {}, sequences up to {} tokens, {} tokens per page\n",
        rt::dataTypeName(plan.config.kvCacheType), layout.elementBytes, layout.elementBytes == 1 ? "" : "s",
        plan.config.maxBatchSize, formatBytes(plan.config.maxSequenceLength), layout.tokensPerPage);
    text += formatQuantization(plan);
    text += formatStep(plan);
    text += formatTensorParallel(plan);
    if (layout.groups.size() > 1)
    {
        text += "  views     slot [2, batch, slotTokens, H, D] and pool [2, pages, tokensPerPage, H, D] per layer\n";
    }
    else
    {
        text += "  views     slot [2, batch, capPadded, H, D] and pool [2, pages, tokensPerPage, H, D] per layer\n";
    }
    if (latent)
    {
        text += "            (1 instead of 2 for a latent layer: K only)\n";
    }
    if (layout.groups.size() > 1)
    {
        text +=
            wrapText(fmt::format("{} page groups, each with its own page ids; a windowed group keeps min(ceil(S/P), "
                                 "ceil((W-1+C)/P)+1) pages a sequence, C = {}",
                         layout.groups.size(), formatBytes(layout.maxTokensPerStep)),
                "  groups    ", "            ", 118)
            + "\n";
        text += formatGroupTable(plan);
    }
    else
    {
        text += fmt::format("  pages     {} per sequence (capPadded {}); {} per layer half", layout.pagesPerSlot,
            formatBytes(layout.capPadded), formatBytes(layout.numPages));
        if (layout.numPages == layout.minPages)
        {
            text += fmt::format(" = the minimum, {} x {}\n", plan.config.maxBatchSize, layout.pagesPerSlot);
        }
        else
        {
            text += fmt::format(", above the minimum {}: the slot view is unavailable\n"
                                "            (getCombinedKVCache throws; use the pool view or getSeparateKVCache)\n",
                formatBytes(layout.minPages));
        }
    }

    text += "\n" + formatLayerTable(plan, perLayer) + "\n";
    int64_t const scaleBytes = detail::totalScaleBytes(layout);
    text += fmt::format("  total     {} bytes ({}) in {} layer buffers{}\n", formatBytes(layout.cacheBytes),
        formatSize(layout.cacheBytes), numCacheLayers,
        scaleBytes == 0 ? std::string() : fmt::format(" and {} scale pools", numCacheLayers));
    if (scaleBytes != 0)
    {
        text += fmt::format("  scales    {} bytes ({}) of the total: {} of the cache\n", formatBytes(scaleBytes),
            formatSize(scaleBytes), formatPercent(scaleBytes, layout.cacheBytes));
    }
    if (layout.stateBytes != 0)
    {
        int64_t const withState = layout.cacheBytes + layout.stateBytes;
        text += fmt::format("  + state   {} bytes ({}) in {} state layers: {} bytes ({}) in all\n",
            formatBytes(layout.stateBytes), formatSize(layout.stateBytes), layout.stateLayers.size(),
            formatBytes(withState), formatSize(withState));
        int64_t const perToken = detail::attentionBytesPerToken(layout);
        text += fmt::format("  per token {} bytes ({}) of attention cache; {} bytes ({}) of state per sequence\n",
            formatBytes(perToken), formatSize(perToken), formatBytes(layout.stateBytesPerSlot),
            formatSize(layout.stateBytesPerSlot));
    }
    text += formatSaving(plan);
    if (layout.groups.size() > 1)
    {
        int64_t perSequence = 0;
        for (rt::KVPageGroupLayout const& group : layout.groups)
        {
            perSequence += int64_t{group.pagesPerSequence} * group.bytesPerPage;
        }
        text += fmt::format("  per seq   {} bytes ({}): the pages of one full-length sequence in every group\n",
            formatBytes(perSequence), formatSize(perSequence));
    }
    else
    {
        bool const allLatent = std::all_of(plan.config.layerConfigs.begin(), plan.config.layerConfigs.end(),
            [](rt::KVLayerConfig const& layer) { return layer.kind == rt::KVLayerKind::kLATENT; });
        text += fmt::format("  per page  {} bytes ({}): {} of one page id in every layer{}\n",
            formatBytes(layout.bytesPerPage), formatSize(layout.bytesPerPage), allLatent ? "K" : "K and V",
            allLatent    ? " (latent layers have no V)"
                : latent ? " (K only for latent layers)"
                         : "");
    }
    text += formatBudget(plan);
    if (plan.shard)
    {
        int64_t const allBytes = layout.cacheBytes * plan.shard->tp;
        text += fmt::format("  all GPUs  {} bytes ({}) in {} shards of {} bytes\n", formatBytes(allBytes),
            formatSize(allBytes), plan.shard->tp, formatBytes(layout.cacheBytes));
        if (layout.stateBytes != 0)
        {
            // Every GPU holds the same state bytes: split heads or channels, or one replicated Mamba2 group each.
            int64_t const allState = layout.stateBytes * plan.shard->tp;
            text += fmt::format("            + {} bytes ({}) of state in {} shards of {} bytes\n",
                formatBytes(allState), formatSize(allState), plan.shard->tp, formatBytes(layout.stateBytes));
        }
    }
    return text;
}

} // namespace kvcache::plan
