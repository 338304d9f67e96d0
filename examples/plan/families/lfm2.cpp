#include "families/family.h"

namespace kvcache::plan::families
{

//! LFM2: short convolution blocks (conv, no KV cache) between attention layers, said by layer_types.
ModelFamily lfm2Family()
{
    return {"LFM2", {"conv"}};
}

} // namespace kvcache::plan::families
