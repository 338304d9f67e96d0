#pragma once

// The token write and read, the latent pool view and the page tables' per-sequence arrays, registered on the module
// and on the classes other files define.

#include "dlpack_view.h"

#include <kvcache/memory/kv_cache_manager.h>

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>

namespace kvcache::python
{

namespace nb = nanobind;

//! A KVCacheManager Python object's manager and the stream its operations run on by default.
struct CacheAccess
{
    rt::KVCacheManager* manager = nullptr;
    cudaStream_t stream = nullptr;
};

//! Returns the parts of `cache`; throws TypeError when it is not a KVCacheManager (defined in manager_binding.cpp).
CacheAccess cacheAccess(nb::handle cache);
//! Returns a view of `tensor`, memory of `cache`, that keeps `cache` alive and orders its consumers after the cache's
//! work (defined in manager_binding.cpp).
DLPackView cacheView(nb::handle cache, rt::Tensor const& tensor);

//! Registers write_tokens, write_tokens_paged, read_tokens and KVCacheManager.latent_pool_view.
void bindWrite(nb::module_& m);
//! Adds first_token, resident_tokens and their host copies to PageTableBuffers (defined in page_table_binding.cpp).
void bindPageTableTokenArrays(nb::module_& m);

} // namespace kvcache::python
