#pragma once

// One way for tests and benchmarks to write a config: named setters over defaults, so no call depends on an argument
// order.

#include "kvcache/core/kv_cache_config.h"

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
// One setter a field: `name(value)` sets `field` and returns the builder, so calls chain.
#define KVCACHE_TEST_CONFIG_SETTER(name, field, Type)                                                                  \
    ConfigBuilder& name(Type value)                                                                                    \
    {                                                                                                                  \
        mConfig.field = value;                                                                                         \
        return *this;                                                                                                  \
    }
    KVCACHE_TEST_CONFIG_SETTER(maxBatchSize, maxBatchSize, int32_t)
    KVCACHE_TEST_CONFIG_SETTER(maxSequenceLength, maxSequenceLength, int32_t)
    KVCACHE_TEST_CONFIG_SETTER(tokensPerPage, tokensPerPage, int32_t)
    KVCACHE_TEST_CONFIG_SETTER(dataType, kvCacheType, rt::DataType)
    KVCACHE_TEST_CONFIG_SETTER(numPages, numPages, int32_t)
    KVCACHE_TEST_CONFIG_SETTER(memPool, memPool, cudaMemPool_t)
    KVCACHE_TEST_CONFIG_SETTER(maxTokensPerStep, maxTokensPerStep, int32_t)
    KVCACHE_TEST_CONFIG_SETTER(numPagesPerGroup, numPagesPerGroup, std::vector<int32_t>)
    KVCACHE_TEST_CONFIG_SETTER(quantization, quantization, rt::KVQuantization)
    KVCACHE_TEST_CONFIG_SETTER(stateLayers, stateLayerConfigs, std::vector<rt::StateLayerConfig>)
    KVCACHE_TEST_CONFIG_SETTER(numCheckpointSlots, numCheckpointSlots, int32_t)
#undef KVCACHE_TEST_CONFIG_SETTER

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

//! A builder for a small cache of `layers`: two sequences of up to 64 tokens in pages of 16.
inline ConfigBuilder smallCacheOf(std::vector<rt::KVLayerConfig> layers)
{
    ConfigBuilder builder(std::move(layers));
    builder.tokensPerPage(16).maxSequenceLength(64).maxBatchSize(2);
    return builder;
}

} // namespace kvcache::test
