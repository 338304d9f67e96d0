#pragma once

//! Umbrella header: everything a runtime needs to own and bind its KV cache.
#include "kvcache/data_type.h"
#include "kvcache/device_allocation.h"
#include "kvcache/errors.h"
#include "kvcache/kv_cache_config.h"
#include "kvcache/kv_cache_layout.h"
#include "kvcache/kv_cache_manager.h"
#include "kvcache/layer_ref.h"
#include "kvcache/page_allocator.h"
#include "kvcache/page_hash.h"
#include "kvcache/page_manager.h"
#include "kvcache/page_ops.h"
#include "kvcache/page_table.h"
#include "kvcache/tensor.h"
#include "kvcache/version.h"
