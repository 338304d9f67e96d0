#pragma once

// What a model family contributes to the config reader. A family is one file in this folder defining one
// `ModelFamily <name>Family()` and one line in registry.cpp; the reader (model_config.cpp) asks the families, in the
// registry's order, which layers attend, how and with what cache shape, and falls back to the generic rules (every
// layer attends, full attention, K and V of num_key_value_heads x head_dim) where none answers.

#include "config_json.h"
#include "model_config.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache::plan::families
{

//! How the cache layers of a model attend, as its config says.
struct LayerAttention
{
    //! One entry per model layer: how it attends, or nothing for a layer without a KV cache.
    std::vector<std::optional<AttentionKind>> kinds = {};
    int32_t slidingWindow = 0; //!< tokens of a sliding layer's window (sliding_window; 0 when absent or null)
    int32_t chunkSize = 0;     //!< tokens of a chunked layer's chunk (attention_chunk_size; 0 when absent)
};

//! What an attention rule reads and writes: the config, and the attention being built.
struct AttentionContext
{
    ConfigReader const& reader;
    ModelTypes const& types;
    int32_t numLayers;
    std::optional<bool> useSlidingWindow; //!< use_sliding_window; false means no layer slides
    LayerAttention& attention;            //!< slidingWindow and chunkSize are read before the rules run
    std::vector<std::string>& notes;      //!< how the config was read, one line a rule
};

//! Returns whether each model layer keeps a KV cache when the config says so in the family's fields; nothing when it
//! does not. Throws ModelConfigError naming the field.
using AttentionLayersRule = std::optional<std::vector<bool>> (*)(ConfigReader const& reader, int32_t numLayers);
//! Sets context.attention.kinds (with fillKinds) and adds a note when the family's rule applies to this config;
//! returns whether it did. Throws ModelConfigError naming the field.
using AttentionRule = bool (*)(AttentionContext& context);
//! Returns the cache shape of each model layer when the family's fields describe it; nothing when they do not.
using ShapeRule = std::optional<std::vector<rt::KVLayerConfig>> (*)(
    ConfigReader const& reader, int32_t numLayers, std::vector<std::string>& notes);

//! Drops from context.attention.kinds the layers that keep no token cache of their own although the rules above made
//! them attention layers (layers that reuse another layer's KV, cross-attention layers), and adds a note naming them,
//! when the family's fields say so. Throws ModelConfigError naming the field.
using KeptLayersRule = void (*)(AttentionContext& context);

//! What a state rule reads: the config, and how each model layer attends (nothing for a layer without a KV cache).
struct StateContext
{
    ConfigReader const& reader;
    ModelTypes const& types;
    int32_t numLayers;
    std::vector<std::optional<AttentionKind>> const& kinds;
    std::vector<std::string>& notes; //!< how the config was read, one line a rule
};

//! Returns the layers that keep a state per sequence, ascending, when the config's model_type is the family's; nothing
//! for another model_type. Throws ModelConfigError naming a missing or inconsistent field.
using StateRule = std::optional<std::vector<StateLayerDescription>> (*)(StateContext const& context);

//! A model family as the config reader sees it; every part is optional.
struct ModelFamily
{
    std::string_view name;                              //!< e.g. "Gemma"
    std::vector<std::string_view> uncachedLayerTypes{}; //!< its layer_types kinds that keep no KV cache
    AttentionLayersRule attentionLayers = nullptr;      //!< which layers attend (without layer_types)
    AttentionRule attention = nullptr;                  //!< how they attend (without layer_types)
    ShapeRule shapes = nullptr;                         //!< the cache shape, when not K and V heads
    FieldDefaults fields = {};                          //!< other field names and defaults of its config class
    KeptLayersRule keptLayers = nullptr;                //!< attention layers without a token cache of their own
    StateRule states = nullptr;                         //!< the layers with a state per sequence
    //! Fields saying which layers attend that its rules read for its model types (fields.modelTypes), although the
    //! reader refuses them for other models.
    std::vector<std::string_view> patternFields{};
};

//! Returns the families in the order their rules are tried (registry.cpp).
std::vector<ModelFamily> const& modelFamilies();

//! Throws ModelConfigError naming sliding_window (`why` says what needs it) when there is no window and
//! use_sliding_window is not false.
void requireWindow(AttentionContext const& context, std::string_view why);

//! Sets context.attention.kinds: kindOf(i) for each layer that attends (see AttentionLayersRule), nothing for the
//! others.
template <typename KindOf>
void fillKinds(AttentionContext& context, KindOf const& kindOf);

//! Returns, for each model layer, whether it keeps a KV cache: the first family's AttentionLayersRule that answers,
//! else every layer.
std::vector<bool> attentionLayers(ConfigReader const& reader, int32_t numLayers);

//! Makes every `period`-th layer full and the others slide (sliding_window_pattern); `source` says where the period
//! came from in the note. Throws ModelConfigError when there is no sliding_window.
void applyWindowPattern(AttentionContext& context, int32_t period, std::string const& source);

//! Returns the window as notes give it: the field's full name and its value, e.g. "sliding_window 4096".
std::string windowText(AttentionContext const& context);

//! Returns hidden_size / num_attention_heads; throws ModelConfigError naming the missing field, or both fields when the
//! division is not whole.
int32_t headDimFromHiddenSize(ConfigReader const& reader);

//! Returns, for each model layer, whether the 0-indexed layer list `field` names it as an attention layer (Bamba's
//! attn_layer_indices, LFM2's full_attn_idxs); nothing when the field is absent. Throws ModelConfigError for a field
//! that is not a list or an index outside the model.
std::optional<std::vector<bool>> listedLayers(ConfigReader const& reader, std::string_view field, int32_t numLayers);

//! Returns the field as an int32 of at least `minimum`; throws ModelConfigError naming it when it is missing (`meaning`
//! says what it is for) or out of range.
int32_t requiredInteger(ConfigReader const& reader, std::string_view field, int32_t minimum, std::string_view meaning);

//! Returns a state tensor split along dimension 0 by `segments` under tensor parallelism.
StateTensorDescription splitTensor(std::string name, std::vector<int64_t> shape, bool recurrent,
    std::vector<rt::StateSplitSegment> segments);

//! Returns a split segment of `parts` parts (heads, groups or channels) of `partSize` entries each, named `field` in
//! messages; `replicated`: kept whole on every GPU.
rt::StateSplitSegment splitParts(int64_t parts, int64_t partSize, std::string const& field, bool replicated = false);

//! Returns a Mamba2 layer's state (vLLM's MambaStateShapeCalculator.mamba2_state_shape; transformers' Mamba2 mixers):
//! conv {numHeads * headDim + 2 * numGroups * stateSize, convKernel - 1}, SSM {numHeads, headDim, stateSize}. Its split
//! over tp GPUs divides the heads (`headsField`) and the groups (`groupsField`); a single group is replicated, a copy on
//! every GPU, as vLLM's extra_groups_for_head_shards does.
StateLayerDescription mamba2State(int32_t modelLayer, int64_t numHeads, int64_t headDim, int64_t numGroups,
    int64_t stateSize, int64_t convKernel, std::string const& headsField, std::string const& groupsField);

//! Returns the model layers without a KV cache in `context.kinds`, ascending.
std::vector<int32_t> layersWithoutAttention(StateContext const& context);

//! Returns "2nd", "4th", "21st", ...
std::string ordinal(int32_t n);

template <typename KindOf>
void fillKinds(AttentionContext& context, KindOf const& kindOf)
{
    std::vector<bool> const cached = attentionLayers(context.reader, context.numLayers);
    for (int32_t i = 0; i < context.numLayers; ++i)
    {
        context.attention.kinds.push_back(
            cached[static_cast<size_t>(i)] ? std::optional<AttentionKind>{kindOf(i)} : std::nullopt);
    }
}

} // namespace kvcache::plan::families
