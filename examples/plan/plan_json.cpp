#include "plan.h"
#include "plan_internal.h"

#include <nlohmann/json.hpp>

#include <utility>

namespace kvcache::plan
{

std::string formatPlanJson(Plan const& plan)
{
    using Json = nlohmann::ordered_json;
    rt::KVCacheLayout const& layout = plan.layout;
    bool const hasState = !layout.stateLayers.empty();
    Json json;
    json["tokensPerPage"] = layout.tokensPerPage;
    json["maxBatchSize"] = plan.config.maxBatchSize;
    json["maxSequenceLength"] = plan.config.maxSequenceLength;
    json["maxTokensPerStep"] = layout.maxTokensPerStep;
    json["dtype"] = rt::dataTypeName(plan.config.kvCacheType);
    json["quantization"] = rt::kvQuantizationName(layout.quantization);
    json["totalBytes"] = layout.cacheBytes;
    json["scaleBytes"] = detail::totalScaleBytes(layout);
    json["groups"] = Json::array();
    for (size_t g = 0; g < layout.groups.size(); ++g)
    {
        rt::KVPageGroupLayout const& group = layout.groups[g];
        Json entry;
        entry["index"] = g;
        entry["slidingWindow"] = group.slidingWindow;
        entry["pagesPerSequence"] = group.pagesPerSequence;
        entry["numPages"] = group.numPages;
        entry["layers"] = group.layers;
        json["groups"].push_back(std::move(entry));
    }
    json["layers"] = Json::array();
    for (size_t i = 0; i < layout.layers.size(); ++i)
    {
        rt::KVLayerLayout const& layer = layout.layers[i];
        Json entry;
        entry["index"] = i;
        entry["kind"] = layer.kind == rt::KVLayerKind::kLATENT ? "latent" : "kv";
        entry["numKVHeads"] = layer.numKVHeads;
        entry["headDim"] = layer.headDim;
        entry["slidingWindow"] = layer.slidingWindow;
        entry["group"] = layer.group;
        entry["slotTokens"] = layer.slotTokens;
        entry["numPages"] = layer.numPages;
        entry["bytes"] = layer.layerBytes;
        entry["scaleBytes"] = layer.scaleBytes;
        entry["bytesPerTokenHeadHalf"] = detail::bytesPerTokenHeadHalf(layout, layer);
        if (hasState)
        {
            entry["stateBytes"] = 0; // an attention layer keeps no state
        }
        json["layers"].push_back(std::move(entry));
    }
    if (hasState)
    {
        json["attentionBytesPerToken"] = detail::attentionBytesPerToken(layout);
        json["stateBytesPerSequence"] = layout.stateBytesPerSlot;
        json["stateSlots"] = layout.numStateSlots;
        json["stateBytes"] = layout.stateBytes;
        json["stateLayers"] = Json::array();
        for (size_t i = 0; i < layout.stateLayers.size(); ++i)
        {
            rt::StateLayerLayout const& layer = layout.stateLayers[i];
            Json entry;
            entry["index"] = i;
            entry["modelLayer"] = plan.model.stateLayers[i].modelLayer;
            entry["kind"] = plan.model.stateLayers[i].kind;
            entry["tensors"] = Json::array();
            for (rt::StateTensorLayout const& tensor : layer.tensors)
            {
                Json described;
                described["name"] = tensor.name;
                described["shape"] = tensor.shape;
                described["dtype"] = rt::dataTypeName(tensor.dataType);
                described["bytesPerSequence"] = tensor.slotBytes;
                entry["tensors"].push_back(std::move(described));
            }
            entry["stateBytes"] = layer.slotBytes;
            json["stateLayers"].push_back(std::move(entry));
        }
    }
    if (plan.shard)
    {
        Json tp;
        tp["size"] = plan.shard->tp;
        tp["rank"] = plan.shard->rank;
        tp["totalBytesAllRanks"] = layout.cacheBytes * plan.shard->tp;
        if (hasState)
        {
            tp["stateBytesAllRanks"] = layout.stateBytes * plan.shard->tp;
        }
        tp["layers"] = Json::array();
        for (size_t i = 0; i < plan.shard->layers.size(); ++i)
        {
            rt::TensorParallelLayerShard const& layer = plan.shard->layers[i];
            Json entry;
            entry["index"] = i;
            entry["firstHead"] = layer.firstHead;
            entry["numKVHeads"] = layer.numHeads;
            entry["replicas"] = layer.replicas;
            tp["layers"].push_back(std::move(entry));
        }
        json["tp"] = std::move(tp);
    }
    if (plan.budgetBytes)
    {
        Json budget;
        budget["bytes"] = *plan.budgetBytes;
        if (plan.budgetSplit)
        {
            budget["sequences"] = plan.budgetSplit->sequences;
            budget["numPagesPerGroup"] = plan.budgetSplit->numPagesPerGroup;
            budget["cacheBytes"] = plan.budgetSplit->bytes;
        }
        else
        {
            int64_t const pages = plan.budgetPages;
            budget["sequences"] = layout.pagesPerSlot == 0 ? 0 : pages / layout.pagesPerSlot;
            budget["numPagesPerGroup"] = std::vector<int64_t>{pages};
            budget["cacheBytes"] = pages * layout.bytesPerPage + layout.stateBytes;
        }
        json["budget"] = std::move(budget);
    }
    return json.dump() + "\n";
}

} // namespace kvcache::plan
