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

//! Layer kinds in "layer_types" that keep a KV cache; every other kind (linear_attention, mamba, ...) does not.
constexpr std::array<std::string_view, 4> kATTENTION_LAYER_TYPES = {
    "attention", "full_attention", "sliding_attention", "chunked_attention"};

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

//! Returns, for each model layer, whether it keeps a KV cache.
std::vector<bool> readAttentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    std::vector<bool> attention(static_cast<size_t>(numLayers), true);
    if (Json const* types = reader.find("layer_types"))
    {
        if (!types->is_array() || types->size() != static_cast<size_t>(numLayers))
        {
            throw reader.bad(reader.name("layer_types"), *types, fmt::format("a list of {} layer kinds", numLayers));
        }
        for (size_t i = 0; i < types->size(); ++i)
        {
            Json const& kind = (*types)[i];
            if (!kind.is_string())
            {
                throw reader.bad(fmt::format("{}[{}]", reader.name("layer_types"), i), kind, "a string");
            }
            std::string const value = kind.get<std::string>();
            attention[i] = std::find(kATTENTION_LAYER_TYPES.begin(), kATTENTION_LAYER_TYPES.end(), value)
                != kATTENTION_LAYER_TYPES.end();
        }
        return attention;
    }
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

} // namespace

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
    ConfigReader const reader = textConfig == nullptr ? top : ConfigReader(*textConfig, source, "text_config.");

    ModelDescription model;
    model.numModelLayers = readNumLayers(reader);
    std::vector<int32_t> const kvHeads = readKVHeads(reader, model.numModelLayers);
    int32_t const headDim = readHeadDim(reader);
    std::vector<bool> const attention = readAttentionLayers(reader, model.numModelLayers);
    for (int32_t i = 0; i < model.numModelLayers; ++i)
    {
        if (attention[static_cast<size_t>(i)])
        {
            model.attentionLayers.push_back(i);
            model.layers.push_back({kvHeads[static_cast<size_t>(i)], headDim});
        }
    }
    if (model.layers.empty())
    {
        throw ModelConfigError(
            fmt::format("{}: none of the {} layers is an attention layer, so there is no KV cache to plan", source,
                model.numModelLayers));
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
