#pragma once

#include "kvcache/core/kv_cache_config.h"

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

//! The most decoder layers a model may have (num_hidden_layers, --layers, --layer-heads): far above any published model
//! (DeepSeek-V3 has 61, Llama-3.1-405B 126), and low enough that the per-layer lists a plan builds stay small. Checked
//! before anything is sized by the layer count, so a hostile config cannot make the planner allocate without bound.
inline constexpr int32_t kMAX_MODEL_LAYERS = 65536;

//! The largest config.json the planner reads, in bytes; published ones are a few kilobytes. A larger file (or a
//! device such as /dev/zero) is an error naming the path and this limit, not unbounded memory.
inline constexpr int64_t kMAX_CONFIG_FILE_BYTES = int64_t{16} << 20;

//! The deepest nesting of objects and lists a config.json may have; published configs nest a few levels (a vision
//! tower's sub-config, rope_scaling), and a bound keeps a hostile file from exhausting the stack of the recursive JSON
//! writer that error messages quote values with.
inline constexpr int32_t kMAX_CONFIG_NESTING = 64;

//! How one cache layer attends, as the model's config describes it.
enum class AttentionKind : int32_t
{
    //! Every earlier token of the sequence.
    kFULL = 0,
    //! The last sliding_window tokens (the token itself included).
    kSLIDING = 1,
    //! The earlier tokens of its own chunk of attention_chunk_size tokens (Llama-4). A token at position p of a chunk
    //! of size K sees the tokens from the chunk's start to p: never more than K tokens, all among the last K, so a
    //! window of K keeps every token a chunk can see and the window's page count is an upper bound. The layer is
    //! planned with slidingWindow = K.
    kCHUNKED = 2,
};

//! Returns "full", "sliding" or "chunked".
char const* attentionKindName(AttentionKind kind);

//! One state tensor of a recurrent or convolution layer, as the model's config sizes it for one sequence.
struct StateTensorDescription
{
    std::string name = {};           //!< "conv", "ssm" or "recurrent"
    std::vector<int64_t> shape = {}; //!< one sequence's extents, in the order docs/layout.md gives for the kernels
    //! True for a recurrent or SSM state (planned in --state-dtype, float32 by default); false for a convolution
    //! window (planned in the model's dtype).
    bool recurrent = false;
    //! How tensor parallelism splits it, as serving engines shard the layer (rt::StateTensorConfig::splitDim and
    //! splitSegments; rt::tensorParallelShard applies it): the dimension split, -1 for none, and its segments.
    int32_t splitDim = -1;
    std::vector<rt::StateSplitSegment> splitSegments = {};
};

//! A model layer that keeps a state per sequence (Mamba, Mamba2, gated delta net, short convolution, KDA).
struct StateLayerDescription
{
    int32_t modelLayer = {}; //!< its decoder layer index
    std::string kind = {};   //!< "mamba", "mamba2", "gated_delta_net", "short_conv" or "kda"
    std::vector<StateTensorDescription> tensors = {}; //!< the whole model's, each with its tensor-parallel split
};

//! The attention layers of a model, as the KV cache sees them.
struct ModelDescription
{
    std::string name = {};                      //!< what the plan's title calls the model
    int32_t numModelLayers = {};                //!< decoder layers, with or without attention
    std::vector<int32_t> attentionLayers = {};  //!< model layer index of each cache layer, ascending
    std::vector<rt::KVLayerConfig> layers = {}; //!< shape, kind (K and V, or one latent) and window of each cache layer
    std::vector<AttentionKind> attentionKinds = {}; //!< how each cache layer attends (a chunked one is planned as a
                                                    //!< window of its chunk size)
    std::vector<std::string> notes = {};            //!< how the config was read: the rules applied, one line each
    std::string dataTypeName = {};                  //!< the config's torch_dtype or dtype; empty when absent
    //! Layers with a state per sequence, ascending by model layer; empty for a model without them. A layer may attend
    //! and keep a state too (Falcon-H1 runs attention and Mamba2 side by side).
    std::vector<StateLayerDescription> stateLayers = {};
};

//! Returns the built-in default: a Llama-3.1-8B-like model, 32 layers of 8 KV heads x 128, float16.
ModelDescription builtinModel();

//! Returns a model whose layers are all attention layers with the given layer configs, titled `name`; a layer with a
//! slidingWindow is a sliding one.
ModelDescription modelFromLayers(std::string name, std::vector<rt::KVLayerConfig> layers);

//! Reads the attention layers from the text of a Hugging Face config.json; `source` names it in messages.
//!
//! Which layers keep a cache and how they attend: layer_types when present (full_attention and attention are full,
//! sliding_attention slides over sliding_window, chunked_attention is chunked by attention_chunk_size;
//! linear_attention, mamba, mamba2, conv and recurrent keep no KV cache); else attn_layer_period and attn_layer_offset
//! pick the attention layers, and the first rule that applies says how they attend: sliding_window_pattern N (Gemma-3,
//! Cohere2: every Nth layer is full, the others slide; the Gemma-3 and Cohere2 defaults 6 and 4 when a config of that
//! model_type leaves it out), Gemma-2 (model_type gemma2: even layers slide), attention_chunk_size with no_rope_layers
//! (Llama-4: 1 = chunked, 0 = full; empty means every 4th layer is full), use_sliding_window true (layers from
//! max_window_layers on slide), sliding_window alone (every layer slides), else full attention. use_sliding_window
//! false makes every layer full. Multi-head latent attention (kv_lora_rank and qk_rope_head_dim) caches one latent of
//! kv_lora_rank + qk_rope_head_dim values a token, K only. Layers that keep no token cache of their own are left out
//! with a note: the last num_kv_shared_layers (Gemma-3n) and cross_attention_layers (Llama-3.2-Vision). A family's
//! config class lends its other field names and defaults (families/*.cpp: Falcon's n_layer and multi_query, GPT-2's
//! n_embd, Gemma-3's head_dim 256), and a note lists every default used.
//!
//! Layers with a state per sequence come from the family of the config's model_type (families/*.cpp, StateRule):
//! gated delta net (qwen3_next, qwen3_5, qwen3_5_moe), Mamba2 (nemotron_h, bamba, granitemoehybrid, falcon_h1), Mamba
//! (jamba), short convolution (lfm2) and KDA (kimi_linear), with vLLM's per-sequence shapes; a note gives the sizes.
//! Python's non-standard Infinity, -Infinity and NaN are read as null.
//!
//! Throws ModelConfigError for malformed JSON, a number out of a double's range, a missing or bad field, more than
//! kMAX_MODEL_LAYERS layers, or a config it cannot read correctly (a layer kind it does not know, one of the two MLA
//! sizes without the other, a sliding layer without sliding_window, ...), naming `source` and the field: never a
//! silent full-size guess.
ModelDescription parseHuggingFaceConfig(std::string_view text, std::string const& source);

//! Reads the file at `path` and parses it with parseHuggingFaceConfig; throws ModelConfigError when it cannot be read
//! or holds more than kMAX_CONFIG_FILE_BYTES.
ModelDescription loadHuggingFaceConfig(std::string const& path);

} // namespace kvcache::plan
