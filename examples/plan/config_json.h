#pragma once

#include "model_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache::plan
{

using Json = nlohmann::json;

//! Reads fields of one JSON object of a config.json (the top level or "text_config") and names them fully, with the
//! file, in every ModelConfigError it throws. Every family reads its fields through it.
class ConfigReader
{
public:
    //! Reads `object` (which must outlive the reader); `prefix` ("" or "text_config.") goes before each field name.
    ConfigReader(Json const& object, std::string source, std::string prefix);

    //! Returns the field, or nullptr when it is absent or null.
    Json const* find(std::string_view field) const;
    //! Returns the field's full name, e.g. "text_config.sliding_window".
    std::string name(std::string_view field) const;
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
    Json const& mObject;
    std::string mSource;
    std::string mPrefix;
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

private:
    std::string mTop;
    std::string mText;
};

} // namespace kvcache::plan
