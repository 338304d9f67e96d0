#pragma once

#include "kvcache/detail/layer_table.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvcache::rt::detail
{

//! Writes `count` host entries to the device table `dst`, stream-ordered on `stream`, without synchronising the host
//! (the entries travel as kernel parameters, not through a pageable copy).
void uploadLayerTable(LayerTableEntry* dst, LayerTableEntry const* entries, int32_t count, cudaStream_t stream);

} // namespace kvcache::rt::detail
