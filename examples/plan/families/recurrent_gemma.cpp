#include "families/family.h"

namespace kvcache::plan::families
{

//! RecurrentGemma (Griffin): recurrent blocks (a recurrent state, no KV cache) between local attention layers. Its
//! own block_types list is not read (the reader asks for layer_types), so only the layer kind is named here.
ModelFamily recurrentGemmaFamily()
{
    return {"RecurrentGemma", {"recurrent"}};
}

} // namespace kvcache::plan::families
