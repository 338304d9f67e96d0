#pragma once

#include "model_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvcache::plan
{

using Json = nlohmann::json;

//! Parses the text of a config.json; throws ModelConfigError naming `source` and, where the parser had reached one,
//! the field (e.g. "text_config.num_hidden_layers") for malformed JSON, a number out of the range of a double (1e400)
//! or nesting deeper than kMAX_CONFIG_NESTING.
Json parseConfigJson(std::string_view text, std::string const& source);

//! What a model family's config class (transformers' configuration_*.py) gives a config.json that leaves fields out:
//! other names for fields (its attribute_map and the keyword arguments it renames) and defaults.
struct FieldDefaults
{
    std::vector<std::string_view> modelTypes = {}; //!< the model_type values the rules apply to
    std::string_view configClass = {};             //!< what notes call the source, e.g. "Gemma3TextConfig"
    std::vector<std::pair<std::string_view, std::string_view>> aliases = {}; //!< {field, its other name}
    std::vector<std::pair<std::string_view, Json>> values = {};              //!< {field, its default}
};

//! Reads fields of one JSON object of a config.json (the top level or "text_config") and names them fully, with the
//! file, in every ModelConfigError it throws. Every family reads its fields through it.
class ConfigReader
{
public:
    //! Reads `object` (which must outlive the reader); `prefix` ("" or "text_config.") goes before each field name.
    //! `defaults` (which must outlive the reader; may be null) supplies other names and defaults for absent fields.
    ConfigReader(Json const& object, std::string source, std::string prefix, FieldDefaults const* defaults = nullptr);

    //! Returns the field, else its other name's value, else its default; nullptr when none is there (null is absent).
    Json const* find(std::string_view field) const;
    //! Returns the full name of the field as the file spells it, e.g. "text_config.sliding_window", or "n_layer" when
    //! num_hidden_layers is read from the other name n_layer.
    std::string name(std::string_view field) const;
    //! Returns the fields `defaults` filled in, as "name value" texts, in the order of `defaults`.
    std::vector<std::string> defaultedFields() const;
    //! Returns the error for a missing field; `meaning` says what it is for.
    ModelConfigError missing(std::string_view field, std::string_view meaning) const;
    //! Returns the error for a field (full name `field`) whose value is not what was `expected`.
    ModelConfigError bad(std::string const& field, Json const& value, std::string_view expected) const;

    //! Returns `value` (named `field`) as an int32 in [minimum, INT32_MAX]; throws ModelConfigError otherwise.
    int32_t integer(Json const& value, std::string const& field, int32_t minimum) const;
    //! Returns the field as an int32 in [minimum, INT32_MAX], or nothing when it is absent or null.
    std::optional<int32_t> optionalInteger(std::string_view field, int32_t minimum) const;
    //! Returns the field as a bool, or nothing when it is absent or null.
    std::optional<bool> optionalBool(std::string_view field) const;
    //! Returns one positive int32 per layer from a list of `numLayers` entries or from one number for all layers.
    std::vector<int32_t> perLayerIntegers(Json const& value, std::string_view field, int32_t numLayers) const;
    //! Returns the first of `fields` that is a string, or an empty string when none is present.
    std::string optionalString(std::initializer_list<std::string_view> fields) const;

    //! Returns what messages call the file.
    std::string const& source() const
    {
        return mSource;
    }

private:
    //! Returns the field itself, else its other name, when the file has a non-null value of one; else nullptr.
    Json const* findInFile(std::string_view field, std::string_view* spelled) const;

    Json const& mObject;
    std::string mSource;
    std::string mPrefix;
    FieldDefaults const* mDefaults;
};

//! The model_type values of the config: the top level's and text_config's.
class ModelTypes
{
public:
    //! Reads model_type from `top` and, when there is one, `text`.
    ModelTypes(ConfigReader const& top, ConfigReader const* text);

    //! Returns whether either model_type is `type`.
    bool is(std::string_view type) const
    {
        return mTop == type || mText == type;
    }

    //! Returns whether either model_type is one of `types`.
    bool isAny(std::vector<std::string_view> const& types) const
    {
        for (std::string_view const type : types)
        {
            if (is(type))
            {
                return true;
            }
        }
        return false;
    }

private:
    std::string mTop;
    std::string mText;
};

} // namespace kvcache::plan
