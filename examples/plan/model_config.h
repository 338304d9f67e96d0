#pragma once

#include "kvcache/kv_cache_config.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache::plan
{

//! Thrown for an unreadable, malformed or incomplete model config; the message names the file and the field.
class ModelConfigError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! The attention layers of a model, as the KV cache sees them.
struct ModelDescription
{
    std::string name = {};                      //!< what the plan's title calls the model
    int32_t numModelLayers = {};                //!< decoder layers, with or without attention
    std::vector<int32_t> attentionLayers = {};  //!< model layer index of each cache layer, ascending
    std::vector<rt::KVLayerConfig> layers = {}; //!< head shape of each cache layer
    std::string dataTypeName = {};              //!< the config's torch_dtype or dtype; empty when absent
};

//! Returns the built-in default: a Llama-3.1-8B-like model, 32 layers of 8 KV heads x 128, float16.
ModelDescription builtinModel();

//! Returns a model whose layers are all attention layers with the given head shapes, titled `name`.
ModelDescription modelFromLayers(std::string name, std::vector<rt::KVLayerConfig> layers);

//! Reads the attention layers from the text of a Hugging Face config.json; `source` names it in messages.
//! Throws ModelConfigError for malformed JSON or a missing or bad field, naming `source` and the field.
ModelDescription parseHuggingFaceConfig(std::string_view text, std::string const& source);

//! Reads the file at `path` and parses it with parseHuggingFaceConfig; throws ModelConfigError when it cannot be read.
ModelDescription loadHuggingFaceConfig(std::string const& path);

} // namespace kvcache::plan
