#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Layers between full-attention layers for a config that leaves sliding_window_pattern out: the default of
//! transformers' Cohere2Config.
constexpr int32_t kCOHERE2_DEFAULT_WINDOW_PATTERN = 4;

bool cohere2DefaultPattern(AttentionContext& context)
{
    if (!context.types.is("cohere2"))
    {
        return false;
    }
    applyWindowPattern(context, kCOHERE2_DEFAULT_WINDOW_PATTERN,
        fmt::format("no sliding_window_pattern, so the cohere2 default {}", kCOHERE2_DEFAULT_WINDOW_PATTERN));
    return true;
}

} // namespace

//! Cohere2 (Command R7B, Command A): every 4th layer full, the others slide, when sliding_window_pattern is left out
//! (a config that gives it is read by the generic sliding_window_pattern rule).
ModelFamily cohereFamily()
{
    return {"Cohere2", {}, nullptr, &cohere2DefaultPattern};
}

} // namespace kvcache::plan::families
