#pragma once

// One way for tests and benchmarks to write a config: named setters over defaults, so no call depends on an argument
// order.

#include "kvcache/kv_cache_config.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace kvcache::test
{

//! Builds a KVCacheConfig for `layers`: batch 1, 128 tokens, 128 tokens a page, float16, the minimum pages, the
//! device's current pool, until a setter says otherwise. numAttentionLayers follows the layers.
class ConfigBuilder
{
public:
    explicit ConfigBuilder(std::vector<rt::KVLayerConfig> layers)
    {
        mConfig.numAttentionLayers = static_cast<int32_t>(layers.size());
        mConfig.layerConfigs = std::move(layers);
        mConfig.maxBatchSize = 1;
        mConfig.maxSequenceLength = 128;
    }
    ConfigBuilder& maxBatchSize(int32_t value)
    {
        mConfig.maxBatchSize = value;
        return *this;
    }
    ConfigBuilder& maxSequenceLength(int32_t value)
    {
        mConfig.maxSequenceLength = value;
        return *this;
    }
    ConfigBuilder& tokensPerPage(int32_t value)
    {
        mConfig.tokensPerPage = value;
        return *this;
    }
    ConfigBuilder& dataType(rt::DataType value)
    {
        mConfig.kvCacheType = value;
        return *this;
    }
    ConfigBuilder& numPages(int32_t value)
    {
        mConfig.numPages = value;
        return *this;
    }
    ConfigBuilder& memPool(cudaMemPool_t value)
    {
        mConfig.memPool = value;
        return *this;
    }
    //! Returns the config.
    rt::KVCacheConfig build() const
    {
        return mConfig;
    }
    operator rt::KVCacheConfig() const
    {
        return mConfig;
    }

private:
    rt::KVCacheConfig mConfig{};
};

} // namespace kvcache::test
