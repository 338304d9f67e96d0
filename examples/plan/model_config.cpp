#include "model_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

namespace kvcache::plan
{
namespace
{

using Json = nlohmann::json;

//! A kind in "layer_types" that keeps a KV cache, and how it attends.
struct CachedLayerType
{
    std::string_view name;
    AttentionKind kind;
};

constexpr std::array<CachedLayerType, 4> kCACHED_LAYER_TYPES = {
    {{"full_attention", AttentionKind::kFULL}, {"attention", AttentionKind::kFULL},
        {"sliding_attention", AttentionKind::kSLIDING}, {"chunked_attention", AttentionKind::kCHUNKED}}};

//! Kinds in "layer_types" that keep no KV cache (a recurrent state or none). Any kind in neither list is an error.
constexpr std::array<std::string_view, 5> kUNCACHED_LAYER_TYPES = {
    "linear_attention", "mamba", "mamba2", "conv", "recurrent"};

//! Fields that say which layers attend in a form the planner does not read. Without layer_types, a config that has one
//! is an error, not a plan with a KV cache in every layer.
constexpr std::array<std::string_view, 4> kUNREAD_LAYER_PATTERN_FIELDS = {
    "hybrid_override_pattern", "layers_block_type", "block_types", "attn_type_list"};

//! Layers between full-attention layers, for configs of these model types that leave sliding_window_pattern out: the
//! defaults of transformers' Gemma3TextConfig and Cohere2Config.
struct DefaultWindowPattern
{
    std::string_view modelType;
    int32_t pattern;
};

constexpr std::array<DefaultWindowPattern, 3> kDEFAULT_WINDOW_PATTERNS = {
    {{"gemma3", 6}, {"gemma3_text", 6}, {"cohere2", 4}}};

//! Llama-4 leaves no_rope_layers empty: then every no_rope_layer_interval-th layer (default 4) is a full-attention
//! (NoPE) layer and the others are chunked.
constexpr int32_t kLLAMA4_DEFAULT_NOPE_INTERVAL = 4;

//! Reads fields of one JSON object (the top level or "text_config") and names them fully in every message.
class ConfigReader
{
public:
    ConfigReader(Json const& object, std::string source, std::string prefix)
        : mObject(object)
        , mSource(std::move(source))
        , mPrefix(std::move(prefix))
    {
    }

    //! Returns the field, or nullptr when it is absent or null.
    Json const* find(std::string_view field) const
    {
        auto const it = mObject.find(field);
        return it == mObject.end() || it->is_null() ? nullptr : &*it;
    }

    std::string name(std::string_view field) const
    {
        return mPrefix + std::string(field);
    }

    ModelConfigError missing(std::string_view field, std::string_view meaning) const
    {
        return ModelConfigError(fmt::format("{}: missing field {} ({})", mSource, name(field), meaning));
    }

    ModelConfigError bad(std::string const& field, Json const& value, std::string_view expected) const
    {
        return ModelConfigError(fmt::format("{}: field {} is {}; expected {}", mSource, field, value.dump(), expected));
    }

    //! Returns `value` (named `field`) as an int32 in [minimum, INT32_MAX].
    int32_t integer(Json const& value, std::string const& field, int32_t minimum) const
    {
        int64_t const limit = std::numeric_limits<int32_t>::max();
        if (!value.is_number_integer() || value.get<int64_t>() < minimum || value.get<int64_t>() > limit)
        {
            throw bad(field, value, fmt::format("a whole number in [{}, {}]", minimum, limit));
        }
        return static_cast<int32_t>(value.get<int64_t>());
    }

    std::optional<int32_t> optionalInteger(std::string_view field, int32_t minimum) const
    {
        Json const* value = find(field);
        return value == nullptr ? std::nullopt : std::optional{integer(*value, name(field), minimum)};
    }

    //! Returns the field as a bool, or nothing when it is absent or null.
    std::optional<bool> optionalBool(std::string_view field) const
    {
        Json const* value = find(field);
        if (value == nullptr)
        {
            return std::nullopt;
        }
        if (!value->is_boolean())
        {
            throw bad(name(field), *value, "true or false");
        }
        return value->get<bool>();
    }

    //! Returns one positive int32 per layer from a list of `numLayers` entries or from one number for all layers.
    std::vector<int32_t> perLayerIntegers(Json const& value, std::string_view field, int32_t numLayers) const
    {
        if (!value.is_array())
        {
            return std::vector<int32_t>(static_cast<size_t>(numLayers), integer(value, name(field), 1));
        }
        if (value.size() != static_cast<size_t>(numLayers))
        {
            throw ModelConfigError(fmt::format(
                "{}: field {} lists {} layers; the model has {}", mSource, name(field), value.size(), numLayers));
        }
        std::vector<int32_t> values;
        for (size_t i = 0; i < value.size(); ++i)
        {
            values.push_back(integer(value[i], fmt::format("{}[{}]", name(field), i), 1));
        }
        return values;
    }

    //! Returns the first of `fields` that is a string, or an empty string when none is present.
    std::string optionalString(std::initializer_list<std::string_view> fields) const
    {
        for (std::string_view const field : fields)
        {
            if (Json const* value = find(field))
            {
                if (!value->is_string())
                {
                    throw bad(name(field), *value, "a string");
                }
                return value->get<std::string>();
            }
        }
        return {};
    }

    std::string const& source() const
    {
        return mSource;
    }

private:
    Json const& mObject;
    std::string mSource;
    std::string mPrefix;
};

int32_t readNumLayers(ConfigReader const& reader)
{
    for (std::string_view const field : {"num_hidden_layers", "num_transformer_layers"})
    {
        if (std::optional<int32_t> const count = reader.optionalInteger(field, 1))
        {
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
    std::optional<int32_t> const hiddenSize = reader.optionalInteger("hidden_size", 1);
    if (!hiddenSize)
    {
        throw reader.missing("head_dim", "or hidden_size and num_attention_heads");
    }
    std::optional<int32_t> const numHeads = reader.optionalInteger("num_attention_heads", 1);
    if (!numHeads)
    {
        throw reader.missing("num_attention_heads", "needed for head_dim = hidden_size / num_attention_heads");
    }
    if (*hiddenSize % *numHeads != 0)
    {
        throw ModelConfigError(fmt::format("{}: {} = {} is not a multiple of {} = {}, so head_dim is not whole; give "
                                           "head_dim",
            reader.source(), reader.name("hidden_size"), *hiddenSize, reader.name("num_attention_heads"), *numHeads));
    }
    return *hiddenSize / *numHeads;
}

//! How the cache layers of a model attend, as its config says.
struct LayerAttention
{
    //! One entry per model layer: how it attends, or nothing for a layer without a KV cache.
    std::vector<std::optional<AttentionKind>> kinds = {};
    int32_t slidingWindow = 0; //!< tokens of a sliding layer's window
    int32_t chunkSize = 0;     //!< tokens of a chunked layer's chunk
};

//! The model_type values of the config: the top level's and text_config's.
class ModelTypes
{
public:
    ModelTypes(ConfigReader const& top, ConfigReader const* text)
        : mTop(top.optionalString({"model_type"}))
        , mText(text == nullptr ? std::string{} : text->optionalString({"model_type"}))
    {
    }

    bool is(std::string_view type) const
    {
        return mTop == type || mText == type;
    }

private:
    std::string mTop;
    std::string mText;
};

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
        if (std::find(kUNCACHED_LAYER_TYPES.begin(), kUNCACHED_LAYER_TYPES.end(), value) != kUNCACHED_LAYER_TYPES.end())
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
        for (std::string_view const type : kUNCACHED_LAYER_TYPES)
        {
            uncached += fmt::format("{}{}", uncached.empty() ? "" : ", ", type);
        }
        throw ModelConfigError(fmt::format("{}: field {}[{}] is \"{}\", an attention kind kvcache-plan does not know, "
                                           "so it cannot tell what the layer caches; known kinds: {} (KV cache) and {} "
                                           "(none)",
            reader.source(), field, i, value, known, uncached));
    }
    return kinds;
}

//! Returns "2nd", "4th", "21st", ...
std::string ordinal(int32_t n)
{
    int32_t const lastTwo = n % 100;
    char const* suffix = (lastTwo >= 11 && lastTwo <= 13) ? "th"
        : n % 10 == 1                                     ? "st"
        : n % 10 == 2                                     ? "nd"
        : n % 10 == 3                                     ? "rd"
                                                          : "th";
    return fmt::format("{}{}", n, suffix);
}

//! Returns, for each model layer, whether it keeps a KV cache, from attn_layer_period and attn_layer_offset (Jamba);
//! every layer when they are absent.
std::vector<bool> readAttentionPeriod(ConfigReader const& reader, int32_t numLayers)
{
    std::vector<bool> attention(static_cast<size_t>(numLayers), true);
    if (std::optional<int32_t> const period = reader.optionalInteger("attn_layer_period", 1))
    {
        std::optional<int32_t> const offset = reader.optionalInteger("attn_layer_offset", 0);
        if (!offset)
        {
            throw reader.missing("attn_layer_offset", "needed with attn_layer_period");
        }
        if (*offset >= *period)
        {
            throw ModelConfigError(fmt::format("{}: {} = {} must be less than {} = {}", reader.source(),
                reader.name("attn_layer_offset"), *offset, reader.name("attn_layer_period"), *period));
        }
        for (int32_t i = 0; i < numLayers; ++i)
        {
            attention[static_cast<size_t>(i)] = i % *period == *offset;
        }
    }
    return attention;
}

//! Reads Llama-4's no_rope_layers (1: RoPE and chunked attention, 0: NoPE and full attention); an empty or absent list
//! means transformers' default, every no_rope_layer_interval-th layer full. Returns whether each layer is chunked.
std::vector<bool> readChunkedLayers(ConfigReader const& reader, ModelTypes const& types, int32_t numLayers,
    int32_t chunkSize, std::vector<std::string>& notes)
{
    std::string const field = reader.name("no_rope_layers");
    std::vector<bool> chunked(static_cast<size_t>(numLayers), false);
    Json const* list = reader.find("no_rope_layers");
    if (list != nullptr && !list->is_array())
    {
        throw reader.bad(field, *list, fmt::format("a list of {} entries, 1 (chunked) or 0 (full)", numLayers));
    }
    if (list != nullptr && !list->empty())
    {
        if (list->size() != static_cast<size_t>(numLayers))
        {
            throw ModelConfigError(fmt::format(
                "{}: field {} lists {} layers; the model has {}", reader.source(), field, list->size(), numLayers));
        }
        for (size_t i = 0; i < list->size(); ++i)
        {
            Json const& entry = (*list)[i];
            bool const one = entry == Json(1) || entry == Json(true);
            if (!one && entry != Json(0) && entry != Json(false))
            {
                throw reader.bad(fmt::format("{}[{}]", field, i), entry, "1 (chunked attention) or 0 (full attention)");
            }
            chunked[i] = one;
        }
        notes.push_back(fmt::format("{}: layers marked 1 use RoPE and chunked attention (attention_chunk_size {}), "
                                    "layers marked 0 are NoPE full-attention layers",
            field, chunkSize));
        return chunked;
    }
    if (!types.is("llama4") && !types.is("llama4_text"))
    {
        throw ModelConfigError(fmt::format("{}: field {} is {}, but neither layer_types nor no_rope_layers says which "
                                           "layers are chunked",
            reader.source(), reader.name("attention_chunk_size"), chunkSize));
    }
    int32_t const interval =
        reader.optionalInteger("no_rope_layer_interval", 1).value_or(kLLAMA4_DEFAULT_NOPE_INTERVAL);
    for (int32_t i = 0; i < numLayers; ++i)
    {
        chunked[static_cast<size_t>(i)] = (i + 1) % interval != 0;
    }
    notes.push_back(fmt::format("{} empty: Llama-4's default, every {} layer ({}, {}, ...) is a NoPE full-attention "
                                "layer, the others use chunked attention (attention_chunk_size {})",
        field, ordinal(interval), interval - 1, 2 * interval - 1, chunkSize));
    return chunked;
}

//! Returns how each model layer attends, from layer_types or the per-model rules (see parseHuggingFaceConfig), before
//! use_sliding_window false turns sliding layers into full ones.
LayerAttention readDeclaredAttention(ConfigReader const& reader, ModelTypes const& types, int32_t numLayers,
    std::optional<bool> useSliding, std::vector<std::string>& notes)
{
    LayerAttention attention;
    // sliding_window 0 or null: no window (Mistral-7B-v0.2 and later publish null).
    std::optional<int32_t> const window = reader.optionalInteger("sliding_window", 0);
    attention.slidingWindow = window.value_or(0);
    std::optional<int32_t> const chunk = reader.optionalInteger("attention_chunk_size", 1);
    attention.chunkSize = chunk.value_or(0);
    std::string const windowField = reader.name("sliding_window");
    // With use_sliding_window false no layer slides, so a sliding layer needs no window.
    auto const requireWindow = [&](std::string_view why)
    {
        if (attention.slidingWindow == 0 && useSliding != false)
        {
            throw reader.missing("sliding_window", why);
        }
    };
    auto const fill = [&](auto const& kindOf)
    {
        std::vector<bool> const cached = readAttentionPeriod(reader, numLayers);
        for (int32_t i = 0; i < numLayers; ++i)
        {
            attention.kinds.push_back(cached[static_cast<size_t>(i)] ? std::optional{kindOf(i)} : std::nullopt);
        }
    };

    if (Json const* layerTypes = reader.find("layer_types"))
    {
        attention.kinds = readLayerTypes(reader, *layerTypes, numLayers);
        bool const anySliding = std::count(attention.kinds.begin(), attention.kinds.end(), AttentionKind::kSLIDING) > 0;
        bool const anyChunked = std::count(attention.kinds.begin(), attention.kinds.end(), AttentionKind::kCHUNKED) > 0;
        if (anySliding)
        {
            requireWindow("needed by the sliding_attention layers of layer_types");
        }
        if (anyChunked && !chunk)
        {
            throw reader.missing("attention_chunk_size", "needed by the chunked_attention layers of layer_types");
        }
        notes.push_back(fmt::format("{}: one attention kind per layer", reader.name("layer_types")));
        return attention;
    }

    for (std::string_view const field : kUNREAD_LAYER_PATTERN_FIELDS)
    {
        if (Json const* value = reader.find(field))
        {
            throw ModelConfigError(fmt::format("{}: field {} ({}) says which layers attend in a form kvcache-plan "
                                               "does not read; add layer_types, one kind per layer",
                reader.source(), reader.name(field), value->dump()));
        }
    }

    std::optional<int32_t> pattern;
    std::string patternSource;
    for (std::string_view const field : {"sliding_window_pattern", "_sliding_window_pattern"})
    {
        if (!pattern)
        {
            pattern = reader.optionalInteger(field, 1);
            patternSource = pattern ? fmt::format("{} {}", reader.name(field), *pattern) : std::string{};
        }
    }
    if (!pattern)
    {
        for (DefaultWindowPattern const& fallback : kDEFAULT_WINDOW_PATTERNS)
        {
            if (types.is(fallback.modelType))
            {
                pattern = fallback.pattern;
                patternSource = fmt::format(
                    "no sliding_window_pattern, so the {} default {}", fallback.modelType, fallback.pattern);
                break;
            }
        }
    }
    if (pattern)
    {
        requireWindow(fmt::format("needed by sliding_window_pattern {}", *pattern));
        int32_t const period = *pattern;
        fill([&](int32_t i) { return (i + 1) % period == 0 ? AttentionKind::kFULL : AttentionKind::kSLIDING; });
        notes.push_back(period == 1
                ? fmt::format("{}: every layer is a full-attention layer", patternSource)
                : fmt::format("{}: every {} layer ({}, {}, ...) is full, the others slide over {} {}", patternSource,
                    ordinal(period), period - 1, 2 * period - 1, windowField, attention.slidingWindow));
        return attention;
    }
    if (types.is("gemma2"))
    {
        requireWindow("Gemma-2 layers alternate sliding and full attention");
        fill([](int32_t i) { return i % 2 == 0 ? AttentionKind::kSLIDING : AttentionKind::kFULL; });
        notes.push_back(fmt::format("Gemma-2 without layer_types: even layers (0, 2, ...) slide over {} {}, odd "
                                    "layers are full",
            windowField, attention.slidingWindow));
        return attention;
    }
    if (chunk)
    {
        if (attention.slidingWindow != 0)
        {
            throw ModelConfigError(fmt::format("{}: fields {} ({}) and {} ({}) are both set and there is no "
                                               "layer_types to say which layers use which",
                reader.source(), reader.name("attention_chunk_size"), *chunk, windowField, attention.slidingWindow));
        }
        std::vector<bool> const chunked = readChunkedLayers(reader, types, numLayers, *chunk, notes);
        fill([&](int32_t i)
            { return chunked[static_cast<size_t>(i)] ? AttentionKind::kCHUNKED : AttentionKind::kFULL; });
        return attention;
    }
    if (useSliding == true)
    {
        requireWindow("needed when use_sliding_window is true");
        int32_t const firstSliding = reader.optionalInteger("max_window_layers", 0).value_or(0);
        fill([&](int32_t i) { return i >= firstSliding ? AttentionKind::kSLIDING : AttentionKind::kFULL; });
        notes.push_back(fmt::format("{} is true: layers from {} = {} on slide over {} {}, the ones before are full",
            reader.name("use_sliding_window"), reader.name("max_window_layers"), firstSliding, windowField,
            attention.slidingWindow));
        return attention;
    }
    if (attention.slidingWindow != 0 && useSliding != false)
    {
        fill([](int32_t) { return AttentionKind::kSLIDING; });
        notes.push_back(fmt::format("{} {} with no layer_types or sliding_window_pattern: every layer slides (as in "
                                    "Mistral-7B-v0.1)",
            windowField, attention.slidingWindow));
        return attention;
    }
    fill([](int32_t) { return AttentionKind::kFULL; });
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
    return attention;
}

//! Returns the cache shape of the model's attention layers: one latent for multi-head latent attention (kv_lora_rank
//! and qk_rope_head_dim), else K and V of num_key_value_heads x head_dim per layer.
std::vector<rt::KVLayerConfig> readLayerShapes(
    ConfigReader const& reader, int32_t numLayers, std::vector<std::string>& notes)
{
    std::optional<int32_t> const rank = reader.optionalInteger("kv_lora_rank", 1);
    std::optional<int32_t> const rope = reader.optionalInteger("qk_rope_head_dim", 1);
    if (rank.has_value() != rope.has_value())
    {
        std::string_view const given = rank ? "kv_lora_rank" : "qk_rope_head_dim";
        std::string_view const absent = rank ? "qk_rope_head_dim" : "kv_lora_rank";
        throw ModelConfigError(fmt::format("{}: field {} is {} but {} is missing; multi-head latent attention caches "
                                           "kv_lora_rank + qk_rope_head_dim values per token, so both are needed",
            reader.source(), reader.name(given), rank ? *rank : *rope, reader.name(absent)));
    }
    if (rank)
    {
        int64_t const width = int64_t{*rank} + *rope;
        if (width > std::numeric_limits<int32_t>::max())
        {
            throw ModelConfigError(fmt::format("{}: {} + {} = {} is over the int32 limit", reader.source(),
                reader.name("kv_lora_rank"), reader.name("qk_rope_head_dim"), width));
        }
        notes.push_back(fmt::format("multi-head latent attention: {} {} + {} {} = one latent of {} values per token "
                                    "and layer, K only (num_key_value_heads and the head dims describe the "
                                    "decompressed heads, not the cache)",
            reader.name("kv_lora_rank"), *rank, reader.name("qk_rope_head_dim"), *rope, width));
        return std::vector<rt::KVLayerConfig>(static_cast<size_t>(numLayers),
            rt::KVLayerConfig{1, static_cast<int32_t>(width), 0, rt::KVLayerKind::kLATENT});
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
    Json root;
    try
    {
        root = Json::parse(text);
    }
    catch (Json::parse_error const& error)
    {
        throw ModelConfigError(fmt::format("{}: malformed JSON: {}", source, error.what()));
    }
    if (!root.is_object())
    {
        throw ModelConfigError(fmt::format("{}: expected a JSON object, got {}", source, root.type_name()));
    }
    ConfigReader const top(root, source, "");
    Json const* textConfig = top.find("text_config");
    if (textConfig != nullptr && !textConfig->is_object())
    {
        throw top.bad("text_config", *textConfig, "an object");
    }
    std::optional<ConfigReader> textReader;
    if (textConfig != nullptr)
    {
        textReader.emplace(*textConfig, source, "text_config.");
    }
    ConfigReader const& reader = textReader ? *textReader : top;
    ModelTypes const types(top, textReader ? &*textReader : nullptr);

    ModelDescription model;
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
    std::ostringstream text;
    text << file.rdbuf();
    if (file.bad())
    {
        throw ModelConfigError(fmt::format("{}: cannot read", path));
    }
    return parseHuggingFaceConfig(text.str(), path);
}

} // namespace kvcache::plan
