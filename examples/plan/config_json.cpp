#include "config_json.h"

#include <fmt/format.h>

#include <limits>
#include <utility>

namespace kvcache::plan
{

ConfigReader::ConfigReader(Json const& object, std::string source, std::string prefix)
    : mObject(object)
    , mSource(std::move(source))
    , mPrefix(std::move(prefix))
{
}

Json const* ConfigReader::find(std::string_view field) const
{
    auto const it = mObject.find(field);
    return it == mObject.end() || it->is_null() ? nullptr : &*it;
}

std::string ConfigReader::name(std::string_view field) const
{
    return mPrefix + std::string(field);
}

ModelConfigError ConfigReader::missing(std::string_view field, std::string_view meaning) const
{
    return ModelConfigError(fmt::format("{}: missing field {} ({})", mSource, name(field), meaning));
}

ModelConfigError ConfigReader::bad(std::string const& field, Json const& value, std::string_view expected) const
{
    return ModelConfigError(fmt::format("{}: field {} is {}; expected {}", mSource, field, value.dump(), expected));
}

int32_t ConfigReader::integer(Json const& value, std::string const& field, int32_t minimum) const
{
    int64_t const limit = std::numeric_limits<int32_t>::max();
    if (!value.is_number_integer() || value.get<int64_t>() < minimum || value.get<int64_t>() > limit)
    {
        throw bad(field, value, fmt::format("a whole number in [{}, {}]", minimum, limit));
    }
    return static_cast<int32_t>(value.get<int64_t>());
}

std::optional<int32_t> ConfigReader::optionalInteger(std::string_view field, int32_t minimum) const
{
    Json const* value = find(field);
    return value == nullptr ? std::nullopt : std::optional{integer(*value, name(field), minimum)};
}

std::optional<bool> ConfigReader::optionalBool(std::string_view field) const
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

std::vector<int32_t> ConfigReader::perLayerIntegers(Json const& value, std::string_view field, int32_t numLayers) const
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

std::string ConfigReader::optionalString(std::initializer_list<std::string_view> fields) const
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

ModelTypes::ModelTypes(ConfigReader const& top, ConfigReader const* text)
    : mTop(top.optionalString({"model_type"}))
    , mText(text == nullptr ? std::string{} : text->optionalString({"model_type"}))
{
}

} // namespace kvcache::plan
