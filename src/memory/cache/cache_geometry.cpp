#include "memory/cache/cache_geometry.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <string>

namespace kvcache::rt::detail
{

void checkGroupGeometry(char const* what, KVCacheManager const& cache, int32_t group, PageGeometry const& expected,
    char const* expectedName)
{
    if (group < 0 || group >= cache.numGroups())
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the cache has {} groups; {} holds pages of group {}", what, cache.numGroups(), expectedName, group));
    }
    std::string const difference =
        pageGeometryDifference(pageGeometry(cache.layout(), group), expected, "the cache", expectedName);
    if (!difference.empty())
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the cache's group {} has another geometry than {}'s: {}", what, group, expectedName, difference));
    }
}

} // namespace kvcache::rt::detail
