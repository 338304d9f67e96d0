#include "config_json.h"

#include <fmt/format.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::plan
{

namespace
{

//! The longest stretch of a field's value an error message quotes: a hostile list of a million entries is named, not
//! printed.
constexpr size_t kMAX_QUOTED_CHARS = 80;

//! Builds the JSON document from the parser's events, keeping the path of the value being read so that an error names
//! its field ("text_config.num_kv_heads[3]").
class ConfigBuilder
{
public:
    explicit ConfigBuilder(std::string const& source)
        : mSource(source)
    {
    }

    bool null()
    {
        return add(Json(nullptr)) != nullptr;
    }
    bool boolean(bool value)
    {
        return add(Json(value)) != nullptr;
    }
    bool number_integer(Json::number_integer_t value)
    {
        return add(Json(value)) != nullptr;
    }
    bool number_unsigned(Json::number_unsigned_t value)
    {
        return add(Json(value)) != nullptr;
    }
    bool number_float(Json::number_float_t value, Json::string_t const& /*text*/)
    {
        return add(Json(value)) != nullptr;
    }
    bool string(Json::string_t& value)
    {
        return add(Json(std::move(value))) != nullptr;
    }
    bool binary(Json::binary_t& value)
    {
        return add(Json::binary(std::move(value))) != nullptr;
    }
    bool start_object(size_t /*size*/)
    {
        return open(Json::object());
    }
    bool key(Json::string_t& key)
    {
        mFrames.back().key = key;
        return true;
    }
    bool end_object()
    {
        mFrames.pop_back();
        return true;
    }
    bool start_array(size_t /*size*/)
    {
        return open(Json::array());
    }
    bool end_array()
    {
        mFrames.pop_back();
        return true;
    }
    // NOLINTNEXTLINE(readability-convert-member-functions-to-static): the parser calls it on the handler.
    bool parse_error(size_t position, std::string const& token, Json::exception const& error)
    {
        std::string const field = path();
        // 406: a number the parser read as a double that is not finite (1e400, -1e400).
        if (error.id == 406)
        {
            throw ModelConfigError(fmt::format("{}: field {} is {}, a number out of the range of a double", mSource,
                field.empty() ? std::string("(top level)") : field, token));
        }
        throw ModelConfigError(fmt::format("{}: malformed JSON{} at byte {}: {}", mSource,
            field.empty() ? std::string() : fmt::format(" in field {}", field), position, error.what()));
    }

    Json& root()
    {
        return mRoot;
    }

private:
    struct Frame
    {
        Json* container;
        std::string key;
    };

    //! Returns the field being read: keys joined by '.', list entries as [index].
    std::string path() const
    {
        std::string text;
        for (size_t i = 0; i < mFrames.size(); ++i)
        {
            Frame const& frame = mFrames[i];
            if (frame.container->is_array())
            {
                // An outer list already holds the entry being read; the innermost one has not added it yet.
                size_t const size = frame.container->size();
                text += fmt::format("[{}]", i + 1 < mFrames.size() ? size - 1 : size);
            }
            else if (!frame.key.empty())
            {
                text += fmt::format("{}{}", text.empty() ? "" : ".", frame.key);
            }
        }
        return text;
    }

    //! Stores `value` where the parser is (the root, the next list entry or the current key) and returns it.
    Json* add(Json value)
    {
        if (mFrames.empty())
        {
            mRoot = std::move(value);
            return &mRoot;
        }
        Frame& frame = mFrames.back();
        if (frame.container->is_array())
        {
            frame.container->push_back(std::move(value));
            return &frame.container->back();
        }
        Json& slot = (*frame.container)[frame.key];
        slot = std::move(value);
        return &slot;
    }

    bool open(Json container)
    {
        if (mFrames.size() >= static_cast<size_t>(kMAX_CONFIG_NESTING))
        {
            throw ModelConfigError(fmt::format("{}: field {} nests objects and lists deeper than kvcache-plan's limit "
                                               "of {} levels",
                mSource, path(), kMAX_CONFIG_NESTING));
        }
        // Objects are ordered maps and a list is not appended to while an entry is open, so the pointer stays valid.
        mFrames.push_back({add(std::move(container)), {}});
        return true;
    }

    std::string const& mSource;
    Json mRoot;
    std::vector<Frame> mFrames;
};

//! Returns `value` as JSON text, cut to kMAX_QUOTED_CHARS characters.
std::string quoted(Json const& value)
{
    std::string text = value.dump();
    if (text.size() > kMAX_QUOTED_CHARS)
    {
        text = fmt::format("{}... ({} characters)", text.substr(0, kMAX_QUOTED_CHARS), text.size());
    }
    return text;
}

//! Returns `text` with the bare Infinity, -Infinity and NaN that Python's json module writes (Nemotron-H's
//! time_step_limit [0.0, Infinity]) replaced by null outside strings. Padding with spaces keeps the byte positions of
//! parse errors, except after a NaN (3 characters for null's 4).
std::string withoutNonFiniteNumbers(std::string_view text)
{
    std::string out;
    out.reserve(text.size());
    bool inString = false;
    for (size_t i = 0; i < text.size(); ++i)
    {
        char const c = text[i];
        if (inString)
        {
            out += c;
            if (c == '\\' && i + 1 < text.size())
            {
                out += text[++i];
            }
            else if (c == '"')
            {
                inString = false;
            }
            continue;
        }
        if (c == '"')
        {
            inString = true;
            out += c;
            continue;
        }
        bool replaced = false;
        for (std::string_view const token : {"-Infinity", "Infinity", "NaN"})
        {
            if (text.substr(i, token.size()) == token)
            {
                out += "null";
                out.append(token.size() > 4 ? token.size() - 4 : 0, ' ');
                i += token.size() - 1;
                replaced = true;
                break;
            }
        }
        if (!replaced)
        {
            out += c;
        }
    }
    return out;
}

} // namespace

Json parseConfigJson(std::string_view text, std::string const& source)
{
    ConfigBuilder builder(source);
    std::string const standard = withoutNonFiniteNumbers(text);
    Json::sax_parse(standard.data(), standard.data() + standard.size(), &builder);
    return std::move(builder.root());
}

ConfigReader::ConfigReader(Json const& object, std::string source, std::string prefix, FieldDefaults const* defaults)
    : mObject(object)
    , mSource(std::move(source))
    , mPrefix(std::move(prefix))
    , mDefaults(defaults)
{
}

Json const* ConfigReader::findInFile(std::string_view field, std::string_view* spelled) const
{
    auto const present = [&](std::string_view name) -> Json const*
    {
        auto const it = mObject.find(name);
        return it == mObject.end() || it->is_null() ? nullptr : &*it;
    };
    *spelled = field;
    if (Json const* value = present(field))
    {
        return value;
    }
    if (mDefaults != nullptr)
    {
        for (auto const& [canonical, alias] : mDefaults->aliases)
        {
            if (canonical != field)
            {
                continue;
            }
            if (Json const* value = present(alias))
            {
                *spelled = alias;
                return value;
            }
        }
    }
    return nullptr;
}

Json const* ConfigReader::find(std::string_view field) const
{
    std::string_view spelled;
    if (Json const* value = findInFile(field, &spelled))
    {
        return value;
    }
    if (mDefaults != nullptr)
    {
        for (auto const& [canonical, value] : mDefaults->values)
        {
            if (canonical == field)
            {
                return &value;
            }
        }
    }
    return nullptr;
}

std::string ConfigReader::name(std::string_view field) const
{
    std::string_view spelled;
    findInFile(field, &spelled);
    return mPrefix + std::string(spelled);
}

std::vector<std::string> ConfigReader::defaultedFields() const
{
    std::vector<std::string> fields;
    if (mDefaults == nullptr)
    {
        return fields;
    }
    for (auto const& [field, value] : mDefaults->values)
    {
        std::string_view spelled;
        if (findInFile(field, &spelled) == nullptr)
        {
            fields.push_back(fmt::format("{} {}", name(field), value.dump()));
        }
    }
    return fields;
}

ModelConfigError ConfigReader::missing(std::string_view field, std::string_view meaning) const
{
    return ModelConfigError(fmt::format("{}: missing field {} ({})", mSource, name(field), meaning));
}

ModelConfigError ConfigReader::bad(std::string const& field, Json const& value, std::string_view expected) const
{
    return ModelConfigError(fmt::format("{}: field {} is {}; expected {}", mSource, field, quoted(value), expected));
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
