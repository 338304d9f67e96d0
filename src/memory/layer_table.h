#pragma once

#include "kvcache/core/device_allocation.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! One layer as the page kernels see it: pages are bytes, so dtype and head shape reduce to pageBytes, and the V pool
//! (when the layer has one) starts numPages * pageBytes after kBase, numPages being the layer's group's. 16 bytes,
//! 16-aligned: a kernel fetches an entry with one load, so whether V exists is folded into the page size.
struct alignas(16) LayerTableEntry
{
    char* kBase;           //!< start of the K pool
    int64_t pageBytesAndV; //!< (bytes of one page of one half) * 2, plus 1 when the layer has a V half
};

//! Returns the entry of a layer whose pages are `pageBytes` and that has a V half or not.
inline LayerTableEntry makeLayerTableEntry(char* kBase, int64_t pageBytes, bool hasV)
{
    return LayerTableEntry{kBase, pageBytes * 2 + (hasV ? 1 : 0)};
}
static_assert(sizeof(LayerTableEntry) == 16, "KVCacheManager::allocatedBytes documents 16 bytes a layer");

//! Allocates the device table of `buffers` (one entry per layer of `layout`, group by group, each group's layers in
//! ascending order) on `stream` from `pool` and fills it stream-ordered, without synchronising the host. Throws as
//! DeviceAllocation does, or CudaError for a failed launch.
DeviceAllocation makeLayerTable(
    std::vector<DeviceAllocation> const& buffers, KVCacheLayout const& layout, cudaStream_t stream, cudaMemPool_t pool);

//! What page operations read of a manager beyond its public interface.
struct ManagerInternals
{
    //! Returns the device table's entries of page group `group`, in the order of its layers (nullptr with no layers).
    static LayerTableEntry const* layerTable(KVCacheManager const& cache, int32_t group) noexcept
    {
        auto const* table = static_cast<LayerTableEntry const*>(cache.mLayerTable.data());
        for (int32_t g = 0; g < group; ++g)
        {
            table += cache.mLayout.groups[static_cast<size_t>(g)].layers.size();
        }
        return table;
    }
};

} // namespace kvcache::rt::detail
