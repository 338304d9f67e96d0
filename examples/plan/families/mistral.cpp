#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! sliding_window alone (no layer_types, no pattern): every layer slides.
bool mistralSlidingLayers(AttentionContext& context)
{
    if (context.attention.slidingWindow == 0 || context.useSlidingWindow == false)
    {
        return false;
    }
    fillKinds(context, [](int32_t) { return AttentionKind::kSLIDING; });
    context.notes.push_back(
        fmt::format("{} with no layer_types or sliding_window_pattern: every layer slides (as in Mistral-7B-v0.1)",
            windowText(context)));
    return true;
}

} // namespace

//! Mistral-7B-v0.1: one sliding window over every layer. Tried last of the window rules: any config with a
//! sliding_window that no other rule places slides in every layer.
ModelFamily mistralFamily()
{
    return {"Mistral", {}, nullptr, &mistralSlidingLayers};
}

} // namespace kvcache::plan::families
