#pragma once

// Configs with state layers that several tests share (the host tier's, the sequence files'), their state slots worked
// out by hand, and the same config without state layers.

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"

#include "support/config_builder.h"

namespace kvcache::test
{

//! One float16 KV layer of 2 x 64 and two state layers, 4 state slots (3 sequences and a checkpoint). Layer 0: conv
//! [6, 3] bfloat16 (36 bytes a slot) and recurrent [2, 4, 4] float32 (128); layer 1: ssm [7] int8 (7): 171 bytes a
//! packed slot. 24 pages (12 above the minimum).
inline rt::KVCacheConfig stateLayerConfig()
{
    return ConfigBuilder({rt::KVLayerConfig{2, 64}})
        .maxBatchSize(3)
        .maxSequenceLength(64)
        .tokensPerPage(16)
        .numPages(24)
        .stateLayers({rt::StateLayerConfig{{rt::StateTensorConfig{"conv", {6, 3}, rt::DataType::kBF16},
                          rt::StateTensorConfig{"recurrent", {2, 4, 4}, rt::DataType::kFLOAT}}},
            rt::StateLayerConfig{{rt::StateTensorConfig{"ssm", {7}, rt::DataType::kINT8}}}})
        .numCheckpointSlots(1);
}

//! A bfloat16 KV layer of full attention beside one of window 32 (its own page group), and one state layer of one
//! float32 tensor [4, 8] (128 bytes a slot), 4 state slots (2 sequences and 2 checkpoints).
inline rt::KVCacheConfig windowedStateLayerConfig()
{
    return ConfigBuilder({{2, 32}, {1, 64, 32}})
        .maxBatchSize(2)
        .maxSequenceLength(128)
        .tokensPerPage(16)
        .maxTokensPerStep(16)
        .dataType(rt::DataType::kBF16)
        .numPagesPerGroup({20, 14})
        .stateLayers({rt::StateLayerConfig{{rt::StateTensorConfig{"ssm", {4, 8}, rt::DataType::kFLOAT}}}})
        .numCheckpointSlots(2);
}

//! Returns `config` without its state layers (and so without checkpoint slots): the same pages, no state.
inline rt::KVCacheConfig withoutStateLayers(rt::KVCacheConfig config)
{
    config.stateLayerConfigs.clear();
    config.numCheckpointSlots = 0;
    return config;
}

} // namespace kvcache::test
