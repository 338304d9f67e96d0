#pragma once

// The models the page-operation benchmark measures, their caches (through the harness) and the page lists its cases
// draw from their pools. docs/benchmarks.md lists the models.

#include "page_ops_harness.h"

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"

#include <cstdint>
#include <vector>

namespace kvcache::bench
{

//! Pages per half and layer: three times the largest list, so source and destination sets drawn from it are
//! disjoint and scattered (the runtime's pool has many retained pages).
constexpr int32_t kPOOL_PAGES = 768;

//! A model's attention layers, cache element type and quantization, and the page group its cases target (-1: the only
//! one).
struct Model
{
    char const* name;
    rt::DataType type;
    std::vector<rt::KVLayerConfig> layers;
    int32_t group = -1;
    rt::KVQuantization quantization = rt::KVQuantization::kNONE;
};

//! 32 x (8, 128), float16.
Model const& uniformModel();
//! 32 x (8, 128), FP8 E4M3 without scales.
Model const& fp8Model();
//! 32 x (8, 128), FP8 E4M3 with a float32 scale a (page, token, head) in each layer's scale pool: a page is 132/128
//! of fp8_uniform's bytes, its scale pages 1/32 of its data pages.
Model const& fp8PerTokenHeadModel();
//! 32 x (8, 128), NVFP4: 64 data bytes (two E2M1 values a byte) and 8 FP8 E4M3 block-scale bytes a (token, head), so
//! its scale pages are 1/8 of its data pages: the smallest data pages here and the largest share of scale bytes.
Model const& nvfp4Model();
//! 32 layers cycling four shapes, float16.
Model const& mixedModel();
//! The gpt-oss-like hybrid model, its cases on group 0 (full attention).
Model const& groupedFullModel();
//! The same cache, its cases on group 1 (the windowed layers).
Model const& groupedWindowModel();

//! Returns the cache of `model`: one sequence of one page, so nearly the whole pool of every group is free for the
//! lists.
rt::KVCacheManager const& cacheOf(Harness& harness, Model const& model);

//! Returns the targeted group's index in `cache` (group -1 is the only one).
int32_t groupOf(Model const& model);

//! Returns the pages per half of the group `model`'s cases target.
int32_t poolPagesOf(rt::KVCacheManager const& cache, Model const& model);

//! Returns `count` distinct page ids in [0, numPages), in a fixed pseudo-random order.
std::vector<int32_t> scatteredPages(int32_t count, int32_t numPages);

//! Returns `count` pairs of scattered pages, no page in two pairs.
std::vector<rt::PageCopy> scatteredPairs(int32_t count, int32_t numPages);

//! Returns `count` pairs whose sources are pages [0, count) and destinations [count, 2 * count), as a sequence forked
//! into freshly allocated pages has.
std::vector<rt::PageCopy> pairsInOneRun(int32_t count);

//! Returns `count` pairs whose sources, and whose destinations, are runs of `runLength` adjacent pages: the pool is cut
//! into runs, taken in a fixed pseudo-random order, sources from the first runs and destinations from the next. Throws
//! std::runtime_error when the pool is too small for them.
std::vector<rt::PageCopy> pairsInRuns(int32_t count, int32_t runLength, int32_t numPages);

} // namespace kvcache::bench
