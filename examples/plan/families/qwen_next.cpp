#include "families/family.h"

namespace kvcache::plan::families
{

//! Qwen3-Next: Gated DeltaNet layers (linear_attention, a recurrent state) between full-attention layers, said by
//! layer_types.
ModelFamily qwenNextFamily()
{
    return {"Qwen3-Next", {"linear_attention"}};
}

} // namespace kvcache::plan::families
