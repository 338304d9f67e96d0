#include "plan.h"

#include "plan_internal.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <ostream>
#include <string_view>
#include <utility>

namespace kvcache::plan
{

using detail::hasWindows;

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
    if (options.kvFormat)
    {
        return options.kvFormat->storage;
    }
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

rt::DataType resolveConvDataType(ModelDescription const& model, PlanOptions const& options)
{
    for (rt::DataType const type : {rt::DataType::kBF16, rt::DataType::kHALF, rt::DataType::kFLOAT})
    {
        if (model.dataTypeName == rt::dataTypeName(type))
        {
            return type;
        }
    }
    if (options.dataType == rt::DataType::kBF16 || options.dataType == rt::DataType::kHALF
        || options.dataType == rt::DataType::kFLOAT)
    {
        return *options.dataType;
    }
    return rt::DataType::kHALF;
}

std::vector<rt::StateLayerConfig> stateLayerConfigs(ModelDescription const& model, PlanOptions const& options)
{
    rt::DataType const convType = resolveConvDataType(model, options);
    std::vector<rt::StateLayerConfig> layers;
    for (StateLayerDescription const& described : model.stateLayers)
    {
        rt::StateLayerConfig layer;
        for (StateTensorDescription const& tensor : described.tensors)
        {
            layer.tensors.push_back({tensor.name, tensor.shape, tensor.recurrent ? options.stateDataType : convType,
                tensor.splitDim, tensor.splitSegments});
        }
        layers.push_back(std::move(layer));
    }
    return layers;
}

Plan makePlan(ModelDescription model, PlanOptions const& options)
{
    if (options.maxTokensPerStep > options.maxSequenceLength)
    {
        throw UsageError(fmt::format("--step-tokens {} is more than --seq-len {}; a step appends at most a whole "
                                     "sequence",
            options.maxTokensPerStep, options.maxSequenceLength));
    }
    Plan plan;
    plan.config.numAttentionLayers = static_cast<int32_t>(model.layers.size());
    plan.config.maxBatchSize = options.maxBatchSize;
    plan.config.maxSequenceLength = options.maxSequenceLength;
    plan.config.layerConfigs = model.layers;
    plan.config.kvCacheType = resolveDataType(model, options);
    plan.config.quantization = options.kvFormat ? options.kvFormat->quantization : rt::KVQuantization::kNONE;
    plan.config.tokensPerPage = options.tokensPerPage;
    plan.config.maxTokensPerStep = options.maxTokensPerStep;
    plan.config.numPages = 0;
    plan.config.stateLayerConfigs = stateLayerConfigs(model, options);
    if (options.tp)
    {
        // Every rank holds the same number of heads a layer and the same state shapes, so GPU 0's shard sizes every
        // GPU. The state layers are split by the rules their families declared.
        try
        {
            plan.shard = rt::tensorParallelShard(plan.config, *options.tp, 0);
        }
        catch (rt::InvalidArgumentError const& error)
        {
            throw UsageError(fmt::format("--tp {}: {}", *options.tp, error.what()));
        }
        plan.config = plan.shard->config;
    }
    rt::KVCacheLayout const minimal = rt::computeLayout(plan.config);
    if (options.numPages != 0 && minimal.groups.size() > 1)
    {
        std::string windows;
        for (rt::KVPageGroupLayout const& group : minimal.groups)
        {
            windows += windows.empty() ? "" : ", ";
            windows += group.slidingWindow == 0 ? std::string("full") : fmt::format("{}", group.slidingWindow);
        }
        throw UsageError(fmt::format("--pages {} sets one page count, but this model has {} page groups (windows: {}); "
                                     "each group's minimum follows from --batch, --seq-len and --step-tokens, and "
                                     "--budget splits memory across the groups",
            options.numPages, minimal.groups.size(), windows));
    }
    plan.config.numPages = options.numPages;
    plan.layout = options.numPages == 0 ? minimal : rt::computeLayout(plan.config);

    // Full length: the same layers with a whole sequence a step; --pages stays unless below that minimum.
    rt::KVCacheConfig fullLength = plan.config;
    fullLength.maxTokensPerStep = 0;
    fullLength.numPages = 0;
    rt::KVCacheLayout fullLayout = rt::computeLayout(fullLength);
    if (options.numPages > fullLayout.numPages)
    {
        fullLength.numPages = options.numPages;
        fullLayout = rt::computeLayout(fullLength);
    }
    plan.fullLengthBytes = fullLayout.cacheBytes;
    if (options.maxTokensPerStep == 0 && hasWindows(plan.config))
    {
        rt::KVCacheConfig stepped = plan.config;
        stepped.numPages = 0;
        stepped.maxTokensPerStep = std::min(kSUGGESTED_STEP_TOKENS, options.maxSequenceLength);
        plan.stepSuggestion =
            StepSuggestion{stepped.maxTokensPerStep, rt::computeLayout(stepped).cacheBytes, minimal.cacheBytes};
    }

    plan.budgetBytes = options.budgetBytes;
    if (plan.budgetBytes && plan.layout.groups.size() > 1)
    {
        plan.budgetSplit = rt::splitBudget(plan.config, *plan.budgetBytes);
    }
    else if (plan.budgetBytes)
    {
        plan.budgetPages = rt::maxPagesForBudget(plan.config, *plan.budgetBytes);
    }
    plan.model = std::move(model);
    return plan;
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
        Plan const plan = makePlan(resolveModel(options), options);
        out << (options.json ? formatPlanJson(plan) : formatPlan(plan, options.perLayer));
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
