#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! use_sliding_window true: layers from max_window_layers on slide, the ones before are full.
bool qwenSlidingLayers(AttentionContext& context)
{
    if (context.useSlidingWindow != true)
    {
        return false;
    }
    ConfigReader const& reader = context.reader;
    requireWindow(context, "needed when use_sliding_window is true");
    int32_t const firstSliding = reader.optionalInteger("max_window_layers", 0).value_or(0);
    fillKinds(context, [&](int32_t i) { return i >= firstSliding ? AttentionKind::kSLIDING : AttentionKind::kFULL; });
    context.notes.push_back(fmt::format("{} is true: layers from {} = {} on slide over {}, the ones before are full",
        reader.name("use_sliding_window"), reader.name("max_window_layers"), firstSliding, windowText(context)));
    return true;
}

} // namespace

//! Qwen2 and Qwen3: a sliding window from max_window_layers on when use_sliding_window is true. (They publish a
//! sliding_window with use_sliding_window false; the reader then keeps every layer full.)
ModelFamily qwenFamily()
{
    return {"Qwen2", {}, nullptr, &qwenSlidingLayers};
}

} // namespace kvcache::plan::families
