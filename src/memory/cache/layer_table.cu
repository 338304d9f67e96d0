#include "memory/cache/layer_table.h"

#include "kvcache/core/errors.h"

#include <algorithm>

namespace kvcache::rt::detail
{
namespace
{

constexpr int32_t kENTRIES_PER_UPLOAD = 64;

//! Entries that travel as kernel parameters, so the upload needs no pageable host copy and no host sync.
template <typename Entry>
struct UploadBatch
{
    Entry entries[kENTRIES_PER_UPLOAD];
    int32_t count;
};

template <typename Entry>
__global__ void uploadTableKernel(Entry* dst, UploadBatch<Entry> batch)
{
    if (static_cast<int32_t>(threadIdx.x) < batch.count)
    {
        dst[threadIdx.x] = batch.entries[threadIdx.x];
    }
}

//! Allocates a device table of `entries` on `stream` from `pool` and uploads them (an empty allocation for none).
template <typename Entry>
DeviceAllocation uploadTable(std::vector<Entry> const& entries, cudaStream_t stream, cudaMemPool_t pool)
{
    auto const count = static_cast<int32_t>(entries.size());
    if (count == 0)
    {
        return {};
    }
    DeviceAllocation table(int64_t{count} * static_cast<int64_t>(sizeof(Entry)), stream, pool);
    auto* const dst = static_cast<Entry*>(table.data());
    for (int32_t first = 0; first < count; first += kENTRIES_PER_UPLOAD)
    {
        UploadBatch<Entry> batch{};
        batch.count = std::min(kENTRIES_PER_UPLOAD, count - first);
        std::copy(entries.begin() + first, entries.begin() + first + batch.count, batch.entries);
        uploadTableKernel<Entry><<<1, kENTRIES_PER_UPLOAD, 0, stream>>>(dst + first, batch);
        KVCACHE_CUDA_TRY(cudaGetLastError());
    }
    return table;
}

std::vector<LayerTableEntry> entriesOf(std::vector<DeviceAllocation> const& buffers,
    std::vector<DeviceAllocation> const& scaleBuffers, KVCacheLayout const& layout)
{
    std::vector<char*> dataBases;
    std::vector<char*> scaleBases;
    for (DeviceAllocation const& buffer : buffers)
    {
        dataBases.push_back(static_cast<char*>(buffer.data()));
    }
    for (DeviceAllocation const& buffer : scaleBuffers)
    {
        scaleBases.push_back(static_cast<char*>(buffer.data()));
    }
    return layerTableEntries(layout, dataBases, scaleBases);
}

} // namespace

std::vector<LayerTableEntry> layerTableEntries(
    KVCacheLayout const& layout, std::vector<char*> const& dataBases, std::vector<char*> const& scaleBases)
{
    std::vector<LayerTableEntry> entries;
    for (size_t g = 0; g < layout.groups.size(); ++g)
    {
        auto const group = static_cast<int32_t>(g);
        for (PageEntry const& entry : pageAnatomy(layout, group).entries)
        {
            auto const layer = static_cast<size_t>(layoutLayer(layout, group, entry));
            entries.push_back(
                makeLayerTableEntry(entry.kind == PagePartKind::kDATA ? dataBases[layer] : scaleBases[layer], entry));
        }
    }
    return entries;
}

std::vector<LayerTableEntry> KVCacheManagerInternal::hostLayerTable(KVCacheManager const& cache, int32_t group)
{
    std::vector<LayerTableEntry> entries = entriesOf(cache.mBuffers, cache.mScaleBuffers, cache.mLayout);
    int64_t first = 0;
    for (int32_t g = 0; g < group; ++g)
    {
        first += groupTableEntries(cache.mLayout, g);
    }
    auto const begin = entries.begin() + first;
    return std::vector<LayerTableEntry>(begin, begin + groupTableEntries(cache.mLayout, group));
}

DeviceAllocation makeLayerTable(std::vector<DeviceAllocation> const& buffers,
    std::vector<DeviceAllocation> const& scaleBuffers, KVCacheLayout const& layout, cudaStream_t stream,
    cudaMemPool_t pool)
{
    return uploadTable(entriesOf(buffers, scaleBuffers, layout), stream, pool);
}

} // namespace kvcache::rt::detail
