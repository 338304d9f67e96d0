// Sequence files over a host tier's host pages: the pages hold data and page scales; the host-held scales (per-tensor
// FP8, NVFP4 global scales) come from the cache and are recorded in, or compared with, the file's header.

#include "core/layout/scale_support.h"
#include "memory/cache/cache_geometry.h"
#include "memory/page_ops/page_list_validation.h"
#include "tiers/host_tier/host_pages/host_page_pool.h"

#include "kvcache/core/errors.h"
#include "kvcache/tiers/host_tier.h"
#include "kvcache/tiers/sequence_file.h"

#include <fmt/format.h>

#include <vector>

namespace kvcache::rt
{
namespace
{

//! Returns the host-held scales of `cache`'s layers of `tier`'s group in the group's order (a latent layer's v as 0),
//! none for a quantization without them. Throws InvalidArgumentError naming `what` and the first difference when
//! `cache`'s group has another geometry than the tier's (checkGroupGeometry).
std::vector<LayerScales> groupLayerScales(char const* what, HostTier const& tier, KVCacheManager const& cache)
{
    int32_t const group = tier.group();
    detail::checkGroupGeometry(what, cache, group, tier.geometry(), "the tier");
    PageGeometry const& geometry = tier.geometry();
    std::vector<LayerScales> scales;
    if (!detail::keepsHostScales(geometry.quantization))
    {
        return scales;
    }
    for (int32_t const layer : cache.group(group).layers)
    {
        LayerScales layerScales = cache.layerScales(layer);
        if (cache.layout().layers[static_cast<size_t>(layer)].kind == KVLayerKind::kLATENT)
        {
            layerScales.v = 0.0F; // no V: what the file records
        }
        scales.push_back(layerScales);
    }
    return scales;
}

//! Throws InvalidArgumentError naming `what` and the quantization when the tier's cache keeps host-held scales, which
//! only the cache knows.
void refuseHostHeldScales(char const* what, HostTier const& tier)
{
    if (detail::keepsHostScales(tier.quantization()))
    {
        throw InvalidArgumentError(fmt::format("{}: KVCacheConfig.quantization is {}, whose host-held layer scales the "
                                               "cache keeps, not the tier: pass the cache ({}(path, tier, cache, ...)) "
                                               "so that the file's scales are recorded or compared",
            what, kvQuantizationName(tier.quantization()), what));
    }
}

//! A sequence's state as a file call takes it: host state `hostState` of the tier and the cache's state tensors;
//! hostState -1 for none.
struct HostStateOfFile
{
    int32_t hostState = -1;
    std::vector<SequenceStateTensor> tensors = {};
};

//! Returns host state `hostState` of `tier` with `cache`'s state tensors. Throws InvalidArgumentError naming `what`
//! when `cache` has no state layers or a state slot of other bytes than the tier's host states, and OutOfRangeError
//! for a host state outside [0, numHostStates()); touches nothing.
HostStateOfFile hostStateOfFile(char const* what, HostTier const& tier, KVCacheManager const& cache, int32_t hostState)
{
    KVCacheLayout const& layout = cache.layout();
    if (layout.stateLayers.empty())
    {
        throw InvalidArgumentError(fmt::format("{}: hostState is {} but the cache has no state layers "
                                               "(stateLayerConfigs is empty)",
            what, hostState));
    }
    if (layout.stateBytesPerSlot != tier.hostStateBytes())
    {
        throw InvalidArgumentError(fmt::format("{}: the cache's state slots hold {} bytes; the tier's host states {}",
            what, layout.stateBytesPerSlot, tier.hostStateBytes()));
    }
    if (hostState < 0 || hostState >= tier.numHostStates())
    {
        throw OutOfRangeError(fmt::format("{}: hostState is {}, outside [0, {}) (HostTierOptions.numHostStates)", what,
            hostState, tier.numHostStates()));
    }
    return HostStateOfFile{hostState, sequenceStateTensors(layout)};
}

void save(std::string const& path, HostTier& tier, std::vector<LayerScales> const& scales, int32_t const* hostPages,
    int64_t count, int64_t tokenCount, HostStateOfFile const& state = {})
{
    tier.synchronizeHostPages(hostPages, count);
    std::vector<void const*> pages;
    pages.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
    {
        pages.push_back(tier.hostPageData(hostPages[i]));
    }
    // hostStateData waits for the tier's transfers touching the host state.
    void const* const stateData = state.hostState < 0 ? nullptr : tier.hostStateData(state.hostState);
    writeSequenceFile(path, tier.geometry(), tokenCount, pages.data(), count, scales, state.tensors, stateData);
}

int64_t load(std::string const& path, HostTier& tier, std::vector<LayerScales> const& scales, int32_t const* hostPages,
    int64_t count, HostStateOfFile const& state = {})
{
    tier.synchronizeHostPages(hostPages, count);
    std::vector<int32_t> sorted(hostPages, hostPages + count);
    detail::validateDistinctIds("loadSequence", "host page", sorted);
    std::vector<void*> pages;
    pages.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
    {
        pages.push_back(tier.hostPageData(hostPages[i]));
    }
    void* const stateData = state.hostState < 0 ? nullptr : tier.hostStateData(state.hostState);
    return readSequenceFile(path, tier.geometry(), pages.data(), count, scales, state.tensors, stateData);
}

} // namespace

void saveSequence(std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages,
    int64_t count, int64_t tokenCount)
{
    save(path, tier, groupLayerScales("saveSequence", tier, cache), hostPages, count, tokenCount);
}

void saveSequence(std::string const& path, HostTier& tier, int32_t const* hostPages, int64_t count, int64_t tokenCount)
{
    refuseHostHeldScales("saveSequence", tier);
    save(path, tier, {}, hostPages, count, tokenCount);
}

int64_t loadSequence(
    std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages, int64_t count)
{
    return load(path, tier, groupLayerScales("loadSequence", tier, cache), hostPages, count);
}

void saveSequence(std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages,
    int64_t count, int64_t tokenCount, int32_t hostState)
{
    constexpr char const* kWHAT = "saveSequence";
    std::vector<LayerScales> const scales = groupLayerScales(kWHAT, tier, cache);
    save(path, tier, scales, hostPages, count, tokenCount, hostStateOfFile(kWHAT, tier, cache, hostState));
}

int64_t loadSequence(std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages,
    int64_t count, int32_t hostState)
{
    constexpr char const* kWHAT = "loadSequence";
    std::vector<LayerScales> const scales = groupLayerScales(kWHAT, tier, cache);
    return load(path, tier, scales, hostPages, count, hostStateOfFile(kWHAT, tier, cache, hostState));
}

int64_t loadSequence(std::string const& path, HostTier& tier, int32_t const* hostPages, int64_t count)
{
    refuseHostHeldScales("loadSequence", tier);
    return load(path, tier, {}, hostPages, count);
}

} // namespace kvcache::rt
