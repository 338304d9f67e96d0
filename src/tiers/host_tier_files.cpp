// Sequence files over a host tier's host pages.

#include "memory/page_list_validation.h"
#include "memory/scale_support.h"
#include "tiers/host_page_pool.h"

#include "kvcache/tiers/host_tier.h"
#include "kvcache/tiers/sequence_file.h"

#include <vector>

namespace kvcache::rt
{

// A quantized cache's host-held scales (per-tensor FP8) are not in its pages; a file without them would restore
// values under whatever scales the loading cache has.
constexpr char const* kNO_FILE_SCALES = "sequence files do not record scales yet";

void saveSequence(std::string const& path, HostTier& tier, int32_t const* hostPages, int64_t count, int64_t tokenCount)
{
    detail::refuseUncarriedScales("saveSequence", tier.quantization(), detail::CarriedScales::kNONE, kNO_FILE_SCALES);
    tier.synchronizeHostPages(hostPages, count);
    std::vector<void const*> pages;
    pages.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
    {
        pages.push_back(tier.hostPageData(hostPages[i]));
    }
    writeSequenceFile(path, tier.geometry(), tokenCount, pages.data(), count);
}

int64_t loadSequence(std::string const& path, HostTier& tier, int32_t const* hostPages, int64_t count)
{
    detail::refuseUncarriedScales("loadSequence", tier.quantization(), detail::CarriedScales::kNONE, kNO_FILE_SCALES);
    tier.synchronizeHostPages(hostPages, count);
    std::vector<int32_t> sorted(hostPages, hostPages + count);
    detail::validateDistinctIds("loadSequence", "host page", sorted);
    std::vector<void*> pages;
    pages.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
    {
        pages.push_back(tier.hostPageData(hostPages[i]));
    }
    return readSequenceFile(path, tier.geometry(), pages.data(), count);
}

} // namespace kvcache::rt
