#pragma once

//! Umbrella header: every public header of the core library (kvcache::kvcache). The optional transfer component
//! (kvcache::transfer) has its own: kvcache/dist/page_transfer.h. Every public name is in kvcache::rt ("runtime"), the
//! namespace of the seed API that KVCacheManager and rt::Tensor come from; kvcache::rt::detail holds internals.

// core: errors, data types, config, layout, page geometry, the device allocation owner, tensor views
#include "kvcache/core/data_type.h"
#include "kvcache/core/device_allocation.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/host_device.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"
#include "kvcache/core/tensor.h"
// memory: the cache, the KV write op, layer references for kernels, page operations
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/kv_write.h"
#include "kvcache/memory/layer_ref.h"
#include "kvcache/memory/page_ops.h"
// paging: page ids, page hashes, the page manager, page tables
#include "kvcache/paging/kv_events.h"
#include "kvcache/paging/page_allocator.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/paging/page_table.h"
#include "kvcache/paging/step_arguments.h"
// tiers: the pinned host tier and sequence files
#include "kvcache/tiers/host_tier.h"
#include "kvcache/tiers/prefix_counters.h"
#include "kvcache/tiers/sequence_file.h"
#include "kvcache/tiers/tiered_prefix_cache.h"
// dist: tensor-parallel shards
#include "kvcache/dist/tensor_parallel.h"
#include "kvcache/dist/transfer_descriptors.h"
#include "kvcache/version.h"
