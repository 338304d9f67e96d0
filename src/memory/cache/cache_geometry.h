#pragma once

// The check every tier runs before it moves a cache's pages: the cache's group must hold pages of the geometry the
// tier was made for.

#include "kvcache/core/page_geometry.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Throws InvalidArgumentError naming `what` when `cache` has no page group `group`, or when that group's page geometry
//! differs from `expected` (the geometry of `expectedName`, e.g. "the tier"), naming the first field that differs.
void checkGroupGeometry(char const* what, KVCacheManager const& cache, int32_t group, PageGeometry const& expected,
    char const* expectedName);

} // namespace kvcache::rt::detail
