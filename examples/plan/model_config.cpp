#include "model_config.h"

#include "config_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>
#include <utility>

#include "families/family.h"

namespace kvcache::plan
{
namespace
{

using families::AttentionContext;
using families::LayerAttention;
using families::ModelFamily;

//! A kind in "layer_types" that keeps a KV cache, and how it attends: one name or two for each AttentionKind. The
//! kinds without a KV cache are open-ended and come from the families (ModelFamily::uncachedLayerTypes).
struct CachedLayerType
{
    std::string_view name;
    AttentionKind kind;
};

constexpr std::array<CachedLayerType, 4> kCACHED_LAYER_TYPES = {
    {{"full_attention", AttentionKind::kFULL}, {"attention", AttentionKind::kFULL},
        {"sliding_attention", AttentionKind::kSLIDING}, {"chunked_attention", AttentionKind::kCHUNKED}}};

//! Fields that say which layers attend in a form the planner does not read. Without layer_types, a config that has one
//! is an error, not a plan with a KV cache in every layer.
constexpr std::array<std::string_view, 4> kUNREAD_LAYER_PATTERN_FIELDS = {
    "hybrid_override_pattern", "layers_block_type", "block_types", "attn_type_list"};

int32_t readNumLayers(ConfigReader const& reader)
{
    for (std::string_view const field : {"num_hidden_layers", "num_transformer_layers"})
    {
        if (std::optional<int32_t> const count = reader.optionalInteger(field, 1))
        {
            if (*count > kMAX_MODEL_LAYERS)
            {
                throw ModelConfigError(fmt::format("{}: field {} is {}; kvcache-plan reads models of at most {} layers",
                    reader.source(), reader.name(field), *count, kMAX_MODEL_LAYERS));
            }
            return *count;
        }
    }
    throw reader.missing("num_hidden_layers", "the number of decoder layers");
}

std::vector<int32_t> readKVHeads(ConfigReader const& reader, int32_t numLayers)
{
    for (std::string_view const field : {"num_kv_heads", "num_key_value_heads", "num_attention_heads"})
    {
        if (Json const* value = reader.find(field))
        {
            return reader.perLayerIntegers(*value, field, numLayers);
        }
    }
    throw reader.missing("num_key_value_heads", "KV heads per layer; or num_kv_heads or num_attention_heads");
}

int32_t readHeadDim(ConfigReader const& reader)
{
    if (std::optional<int32_t> const headDim = reader.optionalInteger("head_dim", 1))
    {
        return *headDim;
    }
    return families::headDimFromHiddenSize(reader);
}

//! Returns whether some family names `value` as a layer_types kind without a KV cache.
bool isUncachedLayerType(std::string_view value)
{
    for (ModelFamily const& family : families::modelFamilies())
    {
        if (std::find(family.uncachedLayerTypes.begin(), family.uncachedLayerTypes.end(), value)
            != family.uncachedLayerTypes.end())
        {
            return true;
        }
    }
    return false;
}

//! Returns whether a family of the config's model_type reads `field` (see ModelFamily::patternFields).
bool familyReadsPatternField(ModelTypes const& types, std::string_view field)
{
    for (ModelFamily const& family : families::modelFamilies())
    {
        if (types.isAny(family.fields.modelTypes)
            && std::find(family.patternFields.begin(), family.patternFields.end(), field) != family.patternFields.end())
        {
            return true;
        }
    }
    return false;
}

//! Returns the layers with a state per sequence: the first family's state rule that answers, else none.
std::vector<StateLayerDescription> readStateLayers(families::StateContext const& context)
{
    for (ModelFamily const& family : families::modelFamilies())
    {
        if (family.states == nullptr)
        {
            continue;
        }
        if (std::optional<std::vector<StateLayerDescription>> layers = family.states(context))
        {
            return *std::move(layers);
        }
    }
    return {};
}

//! Reads layer_types: one kind per layer; throws for a kind the planner does not know.
std::vector<std::optional<AttentionKind>> readLayerTypes(
    ConfigReader const& reader, Json const& types, int32_t numLayers)
{
    std::string const field = reader.name("layer_types");
    if (!types.is_array() || types.size() != static_cast<size_t>(numLayers))
    {
        throw reader.bad(field, types, fmt::format("a list of {} layer kinds", numLayers));
    }
    std::vector<std::optional<AttentionKind>> kinds;
    for (size_t i = 0; i < types.size(); ++i)
    {
        Json const& kind = types[i];
        if (!kind.is_string())
        {
            throw reader.bad(fmt::format("{}[{}]", field, i), kind, "a string");
        }
        std::string const value = kind.get<std::string>();
        auto const cached = std::find_if(kCACHED_LAYER_TYPES.begin(), kCACHED_LAYER_TYPES.end(),
            [&](CachedLayerType const& type) { return type.name == value; });
        if (cached != kCACHED_LAYER_TYPES.end())
        {
            kinds.emplace_back(cached->kind);
            continue;
        }
        if (isUncachedLayerType(value))
        {
            kinds.emplace_back(std::nullopt);
            continue;
        }
        std::string known;
        for (CachedLayerType const& type : kCACHED_LAYER_TYPES)
        {
            known += fmt::format("{}{}", known.empty() ? "" : ", ", type.name);
        }
        std::string uncached;
        for (ModelFamily const& family : families::modelFamilies())
        {
            for (std::string_view const type : family.uncachedLayerTypes)
            {
                uncached += fmt::format("{}{}", uncached.empty() ? "" : ", ", type);
            }
        }
        throw ModelConfigError(fmt::format("{}: field {}[{}] is \"{}\", an attention kind kvcache-plan does not know, "
                                           "so it cannot tell what the layer caches; known kinds: {} (KV cache) and {} "
                                           "(none)",
            reader.source(), field, i, value, known, uncached));
    }
    return kinds;
}

//! Returns how each model layer attends, from layer_types, the generic sliding_window_pattern or the first family rule
//! that applies (see parseHuggingFaceConfig), before use_sliding_window false turns sliding layers into full ones.
LayerAttention readDeclaredAttention(ConfigReader const& reader, ModelTypes const& types, int32_t numLayers,
    std::optional<bool> useSliding, std::vector<std::string>& notes)
{
    LayerAttention attention;
    // sliding_window 0 or null: no window (Mistral-7B-v0.2 and later publish null).
    attention.slidingWindow = reader.optionalInteger("sliding_window", 0).value_or(0);
    attention.chunkSize = reader.optionalInteger("attention_chunk_size", 1).value_or(0);
    AttentionContext context{reader, types, numLayers, useSliding, attention, notes};

    if (Json const* layerTypes = reader.find("layer_types"))
    {
        attention.kinds = readLayerTypes(reader, *layerTypes, numLayers);
        bool const anySliding = std::count(attention.kinds.begin(), attention.kinds.end(), AttentionKind::kSLIDING) > 0;
        bool const anyChunked = std::count(attention.kinds.begin(), attention.kinds.end(), AttentionKind::kCHUNKED) > 0;
        if (anySliding)
        {
            families::requireWindow(context, "needed by the sliding_attention layers of layer_types");
        }
        if (anyChunked && attention.chunkSize == 0)
        {
            throw reader.missing("attention_chunk_size", "needed by the chunked_attention layers of layer_types");
        }
        notes.push_back(fmt::format("{}: one attention kind per layer", reader.name("layer_types")));
        return attention;
    }

    for (std::string_view const field : kUNREAD_LAYER_PATTERN_FIELDS)
    {
        if (Json const* value = reader.find(field); value != nullptr && !familyReadsPatternField(types, field))
        {
            throw ModelConfigError(fmt::format("{}: field {} ({}) says which layers attend in a form kvcache-plan "
                                               "does not read; add layer_types, one kind per layer",
                reader.source(), reader.name(field), value->dump()));
        }
    }

    for (std::string_view const field : {"sliding_window_pattern", "_sliding_window_pattern"})
    {
        if (std::optional<int32_t> const pattern = reader.optionalInteger(field, 1))
        {
            families::applyWindowPattern(context, *pattern, fmt::format("{} {}", reader.name(field), *pattern));
            return attention;
        }
    }
    for (ModelFamily const& family : families::modelFamilies())
    {
        if (family.attention != nullptr && family.attention(context))
        {
            return attention;
        }
    }
    families::fillKinds(context, [](int32_t) { return AttentionKind::kFULL; });
    return attention;
}

//! Returns how each model layer attends: readDeclaredAttention, with every layer full when use_sliding_window is false
//! (Qwen2 and Qwen3 publish a sliding_window they do not use).
LayerAttention readLayerAttention(
    ConfigReader const& reader, ModelTypes const& types, int32_t numLayers, std::vector<std::string>& notes)
{
    std::optional<bool> const useSliding = reader.optionalBool("use_sliding_window");
    LayerAttention attention = readDeclaredAttention(reader, types, numLayers, useSliding, notes);
    if (useSliding == false)
    {
        int64_t const numSliding = std::count(attention.kinds.begin(), attention.kinds.end(), AttentionKind::kSLIDING);
        for (std::optional<AttentionKind>& kind : attention.kinds)
        {
            kind = kind == AttentionKind::kSLIDING ? std::optional{AttentionKind::kFULL} : kind;
        }
        if (numSliding > 0 || attention.slidingWindow != 0)
        {
            notes.push_back(fmt::format("{} is false: no layer slides ({} {}), every attention layer keeps a full "
                                        "cache",
                reader.name("use_sliding_window"), reader.name("sliding_window"),
                attention.slidingWindow == 0 ? std::string("null") : fmt::format("{}", attention.slidingWindow)));
        }
    }
    AttentionContext context{reader, types, numLayers, useSliding, attention, notes};
    for (ModelFamily const& family : families::modelFamilies())
    {
        if (family.keptLayers != nullptr)
        {
            family.keptLayers(context);
        }
    }
    return attention;
}

//! Returns the other names and defaults of the config classes of the families whose model_type the config has.
FieldDefaults familyFieldDefaults(ModelTypes const& types)
{
    FieldDefaults merged;
    for (ModelFamily const& family : families::modelFamilies())
    {
        if (!types.isAny(family.fields.modelTypes))
        {
            continue;
        }
        merged.configClass = merged.configClass.empty() ? family.fields.configClass : merged.configClass;
        merged.aliases.insert(merged.aliases.end(), family.fields.aliases.begin(), family.fields.aliases.end());
        merged.values.insert(merged.values.end(), family.fields.values.begin(), family.fields.values.end());
    }
    return merged;
}

//! Returns the cache shape of the model's attention layers: the first family's shape rule that answers (one latent for
//! multi-head latent attention), else K and V of num_key_value_heads x head_dim per layer.
std::vector<rt::KVLayerConfig> readLayerShapes(
    ConfigReader const& reader, int32_t numLayers, std::vector<std::string>& notes)
{
    for (ModelFamily const& family : families::modelFamilies())
    {
        if (family.shapes == nullptr)
        {
            continue;
        }
        if (std::optional<std::vector<rt::KVLayerConfig>> shapes = family.shapes(reader, numLayers, notes))
        {
            return *std::move(shapes);
        }
    }
    std::vector<int32_t> const kvHeads = readKVHeads(reader, numLayers);
    int32_t const headDim = readHeadDim(reader);
    std::vector<rt::KVLayerConfig> shapes;
    for (int32_t const heads : kvHeads)
    {
        shapes.push_back({heads, headDim});
    }
    return shapes;
}

} // namespace

char const* attentionKindName(AttentionKind kind)
{
    switch (kind)
    {
    case AttentionKind::kFULL: return "full";
    case AttentionKind::kSLIDING: return "sliding";
    case AttentionKind::kCHUNKED: return "chunked";
    }
    return "unknown";
}

ModelDescription builtinModel()
{
    int32_t const numLayers = 32;
    ModelDescription model = modelFromLayers("Llama-3.1-8B-like (built-in)",
        std::vector<rt::KVLayerConfig>(static_cast<size_t>(numLayers), rt::KVLayerConfig{8, 128}));
    model.dataTypeName = "float16";
    return model;
}

ModelDescription modelFromLayers(std::string name, std::vector<rt::KVLayerConfig> layers)
{
    ModelDescription model;
    model.name = std::move(name);
    model.numModelLayers = static_cast<int32_t>(layers.size());
    for (int32_t i = 0; i < model.numModelLayers; ++i)
    {
        model.attentionLayers.push_back(i);
        model.attentionKinds.push_back(
            layers[static_cast<size_t>(i)].slidingWindow > 0 ? AttentionKind::kSLIDING : AttentionKind::kFULL);
    }
    model.layers = std::move(layers);
    return model;
}

ModelDescription parseHuggingFaceConfig(std::string_view text, std::string const& source)
{
    Json const root = parseConfigJson(text, source);
    if (!root.is_object())
    {
        throw ModelConfigError(fmt::format("{}: expected a JSON object, got {}", source, root.type_name()));
    }
    ConfigReader const plainTop(root, source, "");
    Json const* textConfig = plainTop.find("text_config");
    if (textConfig != nullptr && !textConfig->is_object())
    {
        throw plainTop.bad("text_config", *textConfig, "an object");
    }
    std::optional<ConfigReader> plainText;
    if (textConfig != nullptr)
    {
        plainText.emplace(*textConfig, source, "text_config.");
    }
    ModelTypes const types(plainTop, plainText ? &*plainText : nullptr);
    // The family's other names and defaults apply to the object its config class reads: text_config when present.
    FieldDefaults const defaults = familyFieldDefaults(types);
    ConfigReader const top(root, source, "", textConfig == nullptr ? &defaults : nullptr);
    std::optional<ConfigReader> textReader;
    if (textConfig != nullptr)
    {
        textReader.emplace(*textConfig, source, "text_config.", &defaults);
    }
    ConfigReader const& reader = textReader ? *textReader : top;

    ModelDescription model;
    if (std::vector<std::string> const defaulted = reader.defaultedFields(); !defaulted.empty())
    {
        std::string list;
        for (std::string const& field : defaulted)
        {
            list += fmt::format("{}{}", list.empty() ? "" : ", ", field);
        }
        model.notes.push_back(
            fmt::format("fields left out take the defaults of transformers' {}: {}", defaults.configClass, list));
    }
    model.numModelLayers = readNumLayers(reader);
    std::vector<rt::KVLayerConfig> const shapes = readLayerShapes(reader, model.numModelLayers, model.notes);
    LayerAttention const attention = readLayerAttention(reader, types, model.numModelLayers, model.notes);
    bool anyChunked = false;
    for (int32_t i = 0; i < model.numModelLayers; ++i)
    {
        std::optional<AttentionKind> const kind = attention.kinds[static_cast<size_t>(i)];
        if (!kind)
        {
            continue;
        }
        rt::KVLayerConfig layer = shapes[static_cast<size_t>(i)];
        layer.slidingWindow = *kind == AttentionKind::kSLIDING ? attention.slidingWindow
            : *kind == AttentionKind::kCHUNKED                 ? attention.chunkSize
                                                               : 0;
        anyChunked = anyChunked || *kind == AttentionKind::kCHUNKED;
        model.attentionLayers.push_back(i);
        model.layers.push_back(layer);
        model.attentionKinds.push_back(*kind);
    }
    if (model.layers.empty())
    {
        throw ModelConfigError(
            fmt::format("{}: none of the {} layers is an attention layer, so there is no KV cache to plan", source,
                model.numModelLayers));
    }
    model.stateLayers =
        readStateLayers(families::StateContext{reader, types, model.numModelLayers, attention.kinds, model.notes});
    if (anyChunked)
    {
        model.notes.push_back(fmt::format("chunked attention is planned as a sliding window of {} tokens: a token sees "
                                          "at most the {} tokens of its chunk, all among its last {}, so the window's "
                                          "page count is an upper bound",
            attention.chunkSize, attention.chunkSize, attention.chunkSize));
    }
    if (std::optional<int32_t> const nextN = reader.optionalInteger("num_nextn_predict_layers", 0); nextN && *nextN > 0)
    {
        model.notes.push_back(fmt::format(
            "{} {}: multi-token-prediction layers are not planned", reader.name("num_nextn_predict_layers"), *nextN));
    }

    model.dataTypeName = reader.optionalString({"torch_dtype", "dtype"});
    if (model.dataTypeName.empty() && textConfig != nullptr)
    {
        model.dataTypeName = top.optionalString({"torch_dtype", "dtype"});
    }

    std::string architecture = top.optionalString({"model_type"});
    if (Json const* architectures = top.find("architectures"); architectures != nullptr && architectures->is_array()
        && !architectures->empty() && (*architectures)[0].is_string())
    {
        architecture = (*architectures)[0].get<std::string>();
    }
    model.name = architecture.empty() ? source : fmt::format("{} ({})", source, architecture);
    return model;
}

ModelDescription loadHuggingFaceConfig(std::string const& path)
{
    std::ifstream file(path, std::ios::binary);
    if (!file)
    {
        throw ModelConfigError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    // One byte past the limit tells a file at the limit from a longer one (or an endless device) without reading on.
    std::string text(static_cast<size_t>(kMAX_CONFIG_FILE_BYTES) + 1, '\0');
    file.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (file.bad())
    {
        throw ModelConfigError(fmt::format("{}: cannot read", path));
    }
    if (file.gcount() > kMAX_CONFIG_FILE_BYTES)
    {
        throw ModelConfigError(fmt::format(
            "{}: more than {} bytes, kvcache-plan's limit for a config.json", path, kMAX_CONFIG_FILE_BYTES));
    }
    text.resize(static_cast<size_t>(file.gcount()));
    return parseHuggingFaceConfig(text, path);
}

} // namespace kvcache::plan
