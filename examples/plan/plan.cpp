#include "plan.h"

#include "kvcache/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <ostream>
#include <string_view>
#include <utility>

namespace kvcache::plan
{
namespace
{

//! Returns ascending indices as text: "0-31", "3, 7, ..., 47" for an evenly spaced run, else runs like "0-3, 8".
std::string formatIndices(std::vector<int32_t> const& indices)
{
    if (indices.size() >= 4)
    {
        int32_t const step = indices[1] - indices[0];
        bool evenlySpaced = step > 1;
        for (size_t i = 2; i < indices.size() && evenlySpaced; ++i)
        {
            evenlySpaced = indices[i] - indices[i - 1] == step;
        }
        if (evenlySpaced)
        {
            return fmt::format("{}, {}, ..., {}", indices[0], indices[1], indices.back());
        }
    }
    std::string text;
    for (size_t first = 0; first < indices.size();)
    {
        size_t last = first;
        while (last + 1 < indices.size() && indices[last + 1] == indices[last] + 1)
        {
            ++last;
        }
        text += text.empty() ? "" : ", ";
        text += first == last ? fmt::format("{}", indices[first]) : fmt::format("{}-{}", indices[first], indices[last]);
        first = last + 1;
    }
    return text;
}

std::string formatShape(std::array<int64_t, 5> const& dims)
{
    return fmt::format("[{}, {}, {}, {}, {}]", dims[0], dims[1], dims[2], dims[3], dims[4]);
}

//! A table of text cells; columns flagged in `rightAligned` are aligned right.
class TextTable
{
public:
    TextTable(std::vector<std::string> header, std::vector<bool> rightAligned)
        : mRightAligned(std::move(rightAligned))
    {
        mRows.push_back(std::move(header));
    }

    void addRow(std::vector<std::string> row)
    {
        mRows.push_back(std::move(row));
    }

    std::string render(std::string_view indent) const
    {
        std::vector<size_t> widths(mRows.front().size(), 0);
        for (auto const& row : mRows)
        {
            for (size_t c = 0; c < row.size(); ++c)
            {
                widths[c] = std::max(widths[c], row[c].size());
            }
        }
        std::vector<std::string> rule;
        for (size_t const width : widths)
        {
            rule.emplace_back(width, '-');
        }
        std::string text;
        for (size_t r = 0; r < mRows.size(); ++r)
        {
            text += renderRow(indent, mRows[r], widths);
            if (r == 0)
            {
                text += renderRow(indent, rule, widths);
            }
        }
        return text;
    }

private:
    std::string renderRow(
        std::string_view indent, std::vector<std::string> const& row, std::vector<size_t> const& widths) const
    {
        std::string line(indent);
        for (size_t c = 0; c < row.size(); ++c)
        {
            line += c == 0 ? "" : "  ";
            line +=
                mRightAligned[c] ? fmt::format("{:>{}}", row[c], widths[c]) : fmt::format("{:<{}}", row[c], widths[c]);
        }
        while (!line.empty() && line.back() == ' ')
        {
            line.pop_back();
        }
        return line + "\n";
    }

    std::vector<bool> mRightAligned;
    std::vector<std::vector<std::string>> mRows;
};

std::string formatLayerTable(Plan const& plan, bool perLayer)
{
    bool const hybrid = plan.model.numModelLayers != static_cast<int32_t>(plan.model.layers.size());
    std::vector<std::string> header = {perLayer ? "layer" : "layers"};
    std::vector<bool> rightAligned = {false};
    if (hybrid)
    {
        header.emplace_back(perLayer ? "model layer" : "model layers");
        rightAligned.push_back(false);
    }
    for (char const* column : {"H x D", "slot view", "pool view"})
    {
        header.emplace_back(column);
        rightAligned.push_back(false);
    }
    header.emplace_back(perLayer ? "bytes" : "bytes per layer");
    rightAligned.push_back(true);
    if (!perLayer)
    {
        header.emplace_back("bytes");
        rightAligned.push_back(true);
    }
    TextTable table(std::move(header), std::move(rightAligned));

    rt::KVCacheLayout const& layout = plan.layout;
    size_t const numLayers = layout.layers.size();
    for (size_t first = 0; first < numLayers;)
    {
        rt::KVLayerLayout const& layer = layout.layers[first];
        size_t last = first;
        while (!perLayer && last + 1 < numLayers && layout.layers[last + 1].numKVHeads == layer.numKVHeads
            && layout.layers[last + 1].headDim == layer.headDim)
        {
            ++last;
        }
        std::vector<int32_t> cacheLayers;
        std::vector<int32_t> modelLayers;
        for (size_t i = first; i <= last; ++i)
        {
            cacheLayers.push_back(static_cast<int32_t>(i));
            modelLayers.push_back(plan.model.attentionLayers[i]);
        }
        std::vector<std::string> row = {formatIndices(cacheLayers)};
        if (hybrid)
        {
            row.push_back(formatIndices(modelLayers));
        }
        row.push_back(fmt::format("{} x {}", layer.numKVHeads, layer.headDim));
        row.push_back(formatShape({2, plan.config.maxBatchSize, layout.capPadded, layer.numKVHeads, layer.headDim}));
        row.push_back(formatShape({2, layout.numPages, layout.tokensPerPage, layer.numKVHeads, layer.headDim}));
        row.push_back(formatBytes(layer.layerBytes));
        if (!perLayer)
        {
            int64_t const rowBytes = static_cast<int64_t>(last - first + 1) * layer.layerBytes;
            row.push_back(fmt::format("{} ({})", formatBytes(rowBytes), formatSize(rowBytes)));
        }
        table.addRow(std::move(row));
        first = last + 1;
    }
    return table.render("  ");
}

std::string formatBudget(Plan const& plan)
{
    rt::KVCacheLayout const& layout = plan.layout;
    if (!plan.budgetBytes)
    {
        return "  budget    none given (--budget 40GiB shows the pages that fit)\n";
    }
    int64_t const budget = *plan.budgetBytes;
    int64_t const sequences = plan.budgetPages / layout.pagesPerSlot;
    std::string text = fmt::format("  budget    {} bytes ({})\n", formatBytes(budget), formatSize(budget));
    text += fmt::format("  fits      {} pages per layer half = {} full-length sequences", formatBytes(plan.budgetPages),
        formatBytes(sequences));
    if (plan.budgetPages >= layout.minPages)
    {
        text += fmt::format(" ({:.2f}x the minimum {})\n",
            static_cast<double>(plan.budgetPages) / static_cast<double>(layout.minPages), formatBytes(layout.minPages));
    }
    else
    {
        text += fmt::format(
            "; below the minimum {} pages for batch {}\n", formatBytes(layout.minPages), plan.config.maxBatchSize);
    }
    if (layout.cacheBytes > budget)
    {
        text += fmt::format("            the planned cache is {} bytes ({}) over the budget\n",
            formatBytes(layout.cacheBytes - budget), formatSize(layout.cacheBytes - budget));
    }
    return text;
}

} // namespace

std::string formatBytes(int64_t bytes)
{
    std::string const digits = fmt::format("{}", bytes < 0 ? -bytes : bytes);
    std::string text = bytes < 0 ? "-" : "";
    for (size_t i = 0; i < digits.size(); ++i)
    {
        if (i != 0 && (digits.size() - i) % 3 == 0)
        {
            text += ',';
        }
        text += digits[i];
    }
    return text;
}

std::string formatSize(int64_t bytes)
{
    std::array<char const*, 6> const units = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t unit = 0;
    int64_t scale = 1;
    while (unit + 1 < units.size() && bytes / scale >= 1024)
    {
        scale *= 1024;
        ++unit;
    }
    if (unit == 0)
    {
        return fmt::format("{} B", bytes);
    }
    return fmt::format("{:.2f} {}", static_cast<double>(bytes) / static_cast<double>(scale), units[unit]);
}

ModelDescription resolveModel(PlanOptions const& options)
{
    if (!options.configPath.empty())
    {
        return loadHuggingFaceConfig(options.configPath);
    }
    if (!options.layerHeads.empty())
    {
        return modelFromLayers(fmt::format("--layer-heads ({} layers)", options.layerHeads.size()), options.layerHeads);
    }
    ModelDescription model = builtinModel();
    if (!options.numLayers && !options.numKVHeads && !options.headDim)
    {
        return model;
    }
    rt::KVLayerConfig const builtinLayer = model.layers.front();
    int32_t const numLayers = options.numLayers.value_or(model.numModelLayers);
    rt::KVLayerConfig const layer{
        options.numKVHeads.value_or(builtinLayer.numKVHeads), options.headDim.value_or(builtinLayer.headDim)};
    model =
        modelFromLayers(fmt::format("uniform model, {} layers of {} x {}", numLayers, layer.numKVHeads, layer.headDim),
            std::vector<rt::KVLayerConfig>(static_cast<size_t>(numLayers), layer));
    return model;
}

rt::DataType resolveDataType(ModelDescription const& model, PlanOptions const& options)
{
    if (options.dataType)
    {
        return *options.dataType;
    }
    if (model.dataTypeName.empty())
    {
        return rt::DataType::kHALF;
    }
    for (rt::DataType const type : {rt::DataType::kBF16, rt::DataType::kHALF, rt::DataType::kFLOAT})
    {
        if (model.dataTypeName == rt::dataTypeName(type))
        {
            return type;
        }
    }
    throw ModelConfigError(fmt::format("{}: torch_dtype \"{}\" is not bfloat16, float16 or float32; choose the cache "
                                       "type with --dtype",
        model.name, model.dataTypeName));
}

Plan makePlan(ModelDescription model, PlanOptions const& options)
{
    Plan plan;
    plan.config.numAttentionLayers = static_cast<int32_t>(model.layers.size());
    plan.config.maxBatchSize = options.maxBatchSize;
    plan.config.maxSequenceLength = options.maxSequenceLength;
    plan.config.layerConfigs = model.layers;
    plan.config.kvCacheType = resolveDataType(model, options);
    plan.config.numPages = options.numPages;
    plan.config.tokensPerPage = options.tokensPerPage;
    plan.layout = rt::computeLayout(plan.config);
    plan.budgetBytes = options.budgetBytes;
    if (plan.budgetBytes)
    {
        plan.budgetPages = rt::maxPagesForBudget(plan.config, *plan.budgetBytes);
    }
    plan.model = std::move(model);
    return plan;
}

std::string formatPlan(Plan const& plan, bool perLayer)
{
    rt::KVCacheLayout const& layout = plan.layout;
    ModelDescription const& model = plan.model;
    int32_t const numCacheLayers = static_cast<int32_t>(layout.layers.size());
    std::string text = fmt::format("kvcache plan: {}\n\n", model.name);

    text += fmt::format("  layers    {} attention layers", numCacheLayers);
    text += numCacheLayers == model.numModelLayers
        ? "\n"
        : fmt::format(" of {}: model layers {}\n", model.numModelLayers, formatIndices(model.attentionLayers));
    text += fmt::format("  cache     {} ({} byte{}), batch {}, sequences up to {} tokens, {} tokens per page\n",
        rt::dataTypeName(plan.config.kvCacheType), layout.elementBytes, layout.elementBytes == 1 ? "" : "s",
        plan.config.maxBatchSize, formatBytes(plan.config.maxSequenceLength), layout.tokensPerPage);
    text += "  views     slot [2, batch, capPadded, H, D] and pool [2, pages, tokensPerPage, H, D] per layer\n";
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

    text += "\n" + formatLayerTable(plan, perLayer) + "\n";
    text += fmt::format("  total     {} bytes ({}) in {} layer buffers\n", formatBytes(layout.cacheBytes),
        formatSize(layout.cacheBytes), numCacheLayers);
    text += fmt::format("  per page  {} bytes ({}): K and V of one page id in every layer\n",
        formatBytes(layout.bytesPerPage), formatSize(layout.bytesPerPage));
    text += formatBudget(plan);
    return text;
}

int runPlanProgram(std::vector<std::string> const& args, std::ostream& out, std::ostream& err)
{
    try
    {
        PlanOptions const options = parseArguments(args);
        if (options.help)
        {
            out << usageText();
            return 0;
        }
        out << formatPlan(makePlan(resolveModel(options), options), options.perLayer);
        return 0;
    }
    catch (UsageError const& error)
    {
        err << "kvcache-plan: " << error.what() << "\n";
    }
    catch (ModelConfigError const& error)
    {
        err << "kvcache-plan: " << error.what() << "\n";
    }
    catch (rt::InvalidArgumentError const& error)
    {
        err << "kvcache-plan: invalid cache config: " << error.what() << "\n";
    }
    return kEXIT_BAD_INPUT;
}

} // namespace kvcache::plan
