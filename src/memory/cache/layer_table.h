#pragma once

#include "core/layout/page_anatomy.h"
#include "core/layout/scale_support.h"

#include "kvcache/core/device_allocation.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! Returns the entries page group `group` of `layout` takes in the table: as many as pageAnatomy has entries: one per
//! layer, two per layer when the cache keeps scale pools (a data entry and a scale entry).
inline int64_t groupTableEntries(KVCacheLayout const& layout, int32_t group)
{
    auto const layers = static_cast<int64_t>(layout.groups[static_cast<size_t>(group)].layers.size());
    return keepsScalePools(layout.quantization) ? 2 * layers : layers;
}

//! Returns the table of `layout` (host side, no CUDA), group by group: each group's page entries (pageAnatomy), a data
//! entry's pool at dataBases[layer] and a scale entry's at scaleBases[layer]. A scale pool is K scales then V scales
//! numPages pages on, exactly a data pool's shape, so the page kernels walk it unchanged (docs/layout.md, "How every
//! page operation carries scales"). `scaleBases` is read only with scale pools; both hold one base per layer, indexed
//! by layer.
std::vector<LayerTableEntry> layerTableEntries(
    KVCacheLayout const& layout, std::vector<char*> const& dataBases, std::vector<char*> const& scaleBases);

//! Allocates the device table of layerTableEntries(layout, data bases, scale bases) of `buffers` and `scaleBuffers`
//! (one each a layer; the scale buffers are read only with scale pools) on `stream` from `pool` and fills it
//! stream-ordered, without synchronising the host. Throws as DeviceAllocation does, or CudaError for a failed launch.
DeviceAllocation makeLayerTable(std::vector<DeviceAllocation> const& buffers,
    std::vector<DeviceAllocation> const& scaleBuffers, KVCacheLayout const& layout, cudaStream_t stream,
    cudaMemPool_t pool);

//! The library's own access to a KVCacheManager beyond its public calls: what page operations read of it.
class KVCacheManagerInternal
{
public:
    //! Returns the device table's data entries of page group `group`, in the order of its layers (nullptr with no
    //! layers).
    static LayerTableEntry const* layerTable(KVCacheManager const& cache, int32_t group) noexcept
    {
        auto const* table = static_cast<LayerTableEntry const*>(cache.mLayerTable.data());
        for (int32_t g = 0; g < group; ++g)
        {
            table += groupTableEntries(cache.mLayout, g);
        }
        return table;
    }
    //! Returns a host copy of the device table's entries of page group `group`: its data entries, then its scale
    //! entries (with scale pools), as layerTable and scaleTable point to them.
    static std::vector<LayerTableEntry> hostLayerTable(KVCacheManager const& cache, int32_t group);
    //! Returns the device table's scale entries of page group `group`, in the order of its layers, right after its
    //! data entries; nullptr when the cache keeps no scale pools.
    static LayerTableEntry const* scaleTable(KVCacheManager const& cache, int32_t group) noexcept
    {
        if (!keepsScalePools(cache.mLayout.quantization) || cache.mLayout.groups.empty())
        {
            return nullptr;
        }
        return layerTable(cache, group) + cache.mLayout.groups[static_cast<size_t>(group)].layers.size();
    }
};

} // namespace kvcache::rt::detail
