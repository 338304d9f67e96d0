#pragma once

// What a sequence file records of a quantization (docs/layout.md, "Sequence files"): the rules a quantized geometry
// follows, the page scale bytes it implies, and the host-held scales of a header, checked and compared. No file I/O.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/page_geometry.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt::detail
{

//! Returns "" when `geometry`'s quantization is in the enumeration and its dataType and layers can hold it (the rules
//! of computeLayout), else the first broken rule naming the field, its value and the limit.
std::string quantizationProblem(PageGeometry const& geometry);

//! Throws InvalidArgumentError, naming `prefix` then `name` (e.g. "layerScales"), the field, its value and the limit,
//! when `scales` do not suit `geometry` (any geometry: only its quantization and layer kinds are read): one entry a
//! layer, each used scale valid (detail::isValidHostScale), for a quantization that keeps host-held scales; none for
//! the others. A latent layer's `v` is not used, so not checked.
void checkLayerScales(
    std::string const& prefix, char const* name, PageGeometry const& geometry, std::vector<LayerScales> const& scales);

//! Throws InvalidArgumentError naming the first layer scale of `geometry` (the file's, equal to the destination's)
//! where the file's `file` differ bit for bit from `expected`, with both values; a latent layer's `v` is not compared.
void expectLayerScales(char const* what, std::string const& path, PageGeometry const& geometry,
    std::vector<LayerScales> const& file, std::vector<LayerScales> const& expected);

} // namespace kvcache::rt::detail
