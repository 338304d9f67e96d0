#pragma once

#include "kvcache/device_allocation.h"
#include "kvcache/kv_cache_layout.h"
#include "kvcache/kv_cache_manager.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! One layer as the page kernels see it: pages are bytes, so dtype and head shape reduce to pageBytes, and the V pool
//! starts numPages * pageBytes after kBase. 16 bytes, 16-aligned: a kernel fetches an entry with one load.
struct alignas(16) LayerTableEntry
{
    char* kBase;       //!< start of the K pool
    int64_t pageBytes; //!< bytes of one page of one half
};
static_assert(sizeof(LayerTableEntry) == 16, "KVCacheManager::allocatedBytes documents 16 bytes a layer");

//! Allocates the device table of `buffers` (one entry per layer of `layout`) on `stream` from `pool` and fills it
//! stream-ordered, without synchronising the host. Throws as DeviceAllocation does, or CudaError for a failed launch.
DeviceAllocation makeLayerTable(
    std::vector<DeviceAllocation> const& buffers, KVCacheLayout const& layout, cudaStream_t stream, cudaMemPool_t pool);

//! What page operations read of a manager beyond its public interface.
struct ManagerInternals
{
    //! Returns the device table (nullptr with no layers).
    static LayerTableEntry const* layerTable(KVCacheManager const& cache) noexcept
    {
        return static_cast<LayerTableEntry const*>(cache.mLayerTable.data());
    }
};

} // namespace kvcache::rt::detail
