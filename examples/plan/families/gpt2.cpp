#include "families/family.h"

namespace kvcache::plan::families
{

//! GPT-2: full attention in every layer, one K and V head per attention head, head_dim n_embd / n_head (the generic
//! rules), read with the names of transformers' GPT2Config (n_layer, n_head, n_embd).
ModelFamily gpt2Family()
{
    return {"GPT-2", {}, nullptr, nullptr, nullptr,
        FieldDefaults{{"gpt2"}, "GPT2Config",
            {{"num_hidden_layers", "n_layer"}, {"num_attention_heads", "n_head"}, {"hidden_size", "n_embd"}}, {}}};
}

} // namespace kvcache::plan::families
