// A decode step's kernel arguments built on the host (no GPU): 256 sequences of 64 pages of 16 tokens in two page
// groups, full attention and a window of 128 tokens (25 pages a sequence), each sequence taking one token. Cases:
//  - page_tables: what two PageTableBuffers::build() calls write, one a group: each sequence's pages() per group and
//    detail::buildPageTables into that group's staging region, two regions in turn as build() alternates. The
//    positions and qo_indptr a runtime then built by hand are not counted.
//  - step_arguments: detail::buildStepArguments, what StepArgumentBuffers::build() writes: the same tables, the
//    positions, qo_indptr and the token count, into one region of the two.
// Both leave out the CUDA calls (capture check, event query, one cudaMemcpyAsync and event record a build: two of
// each for the page tables, one for the step arguments), so they run without a GPU; the regions are pageable memory.
// Host wall time a call. See docs/benchmarks.md.

#include "bench_main.h"
#include "paging/page_table/page_table_build.h"
#include "paging/page_table/step_arguments_build.h"

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/paging/page_manager.h"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace kvcache::bench
{
namespace
{

constexpr int32_t kBATCH = 256;
constexpr int32_t kTOKENS_PER_PAGE = 16;
constexpr int32_t kLENGTH = 64 * kTOKENS_PER_PAGE;

//! A manager of kBATCH sequences of kLENGTH - 1 tokens and the decode step that takes each to kLENGTH.
struct DecodeStep
{
    DecodeStep()
    {
        rt::KVCacheConfig config;
        config.numAttentionLayers = 2;
        config.maxBatchSize = kBATCH;
        config.maxSequenceLength = kLENGTH;
        config.tokensPerPage = kTOKENS_PER_PAGE;
        config.maxTokensPerStep = kBATCH;
        config.layerConfigs = {{1, 8}, {1, 8, 128}};
        config.kvCacheType = rt::DataType::kHALF;
        rt::PageManagerOptions options;
        options.enablePrefixCaching = false;
        manager = std::make_unique<rt::PageManager>(config, options);
        std::vector<int32_t> const tokens(kBATCH, 1);
        for (int32_t b = 0; b < kBATCH; ++b)
        {
            rt::SequenceId const id = manager->create();
            for (int32_t at = 0; at < kLENGTH - 1; at += kBATCH)
            {
                rt::SequenceAppend const chunk{id, tokens.data(), std::min(kBATCH, kLENGTH - 1 - at), nullptr, 0};
                manager->step(&chunk, 1);
            }
            entries.push_back({id, tokens.data(), 1, nullptr, 0});
        }
        manager->step(entries.data(), kBATCH);
    }

    std::unique_ptr<rt::PageManager> manager;
    std::vector<rt::SequenceAppend> entries;
};

void pageTables(benchmark::State& state)
{
    guarded(state,
        [&]
        {
            DecodeStep const step;
            rt::PageManager const& manager = *step.manager;
            std::vector<rt::detail::PageTableShape> shapes;
            std::vector<std::vector<int32_t>> regions;
            for (rt::KVPageGroupLayout const& group : manager.layout().groups)
            {
                shapes.push_back(rt::detail::makePageTableShape(kBATCH, group.pagesPerSequence, kTOKENS_PER_PAGE));
                for (int32_t r = 0; r < 2; ++r)
                {
                    regions.emplace_back(static_cast<size_t>(shapes.back().elements()));
                    rt::detail::writeEmptyPageTables(shapes.back(), regions.back().data());
                }
            }
            check(shapes.size() == 2 && shapes[1].maxPagesPerSequence == 25, "two groups, the window 25 pages wide");
            std::vector<rt::SequencePages> sequences(kBATCH);
            int64_t call = 0;
            for (auto _ : state)
            {
                for (size_t g = 0; g < shapes.size(); ++g)
                {
                    for (int32_t b = 0; b < kBATCH; ++b)
                    {
                        sequences[static_cast<size_t>(b)] =
                            manager.pages(step.entries[static_cast<size_t>(b)].sequence, static_cast<int32_t>(g));
                    }
                    std::vector<int32_t>& region = regions[2 * g + static_cast<size_t>(call % 2)];
                    benchmark::DoNotOptimize(
                        rt::detail::buildPageTables(shapes[g], sequences.data(), kBATCH, region.data()));
                }
                ++call;
            }
        });
}

void stepArguments(benchmark::State& state)
{
    guarded(state,
        [&]
        {
            DecodeStep const step;
            rt::detail::StepArgumentShape const shape =
                rt::detail::makeStepArgumentShape(*step.manager, kBATCH, kBATCH);
            std::vector<int32_t> regions[2];
            for (std::vector<int32_t>& region : regions)
            {
                region.resize(static_cast<size_t>(shape.elements()));
                rt::detail::writeEmptyStepArguments(shape, region.data());
            }
            rt::detail::StepScratch scratch;
            int64_t call = 0;
            for (auto _ : state)
            {
                benchmark::DoNotOptimize(rt::detail::buildStepArguments(
                    shape, *step.manager, step.entries.data(), kBATCH, regions[call++ % 2].data(), scratch));
            }
        });
}

BENCHMARK(pageTables)->Name("page_tables/256x64_two_groups")->Unit(benchmark::kMicrosecond);
BENCHMARK(stepArguments)->Name("step_arguments/256x64_two_groups")->Unit(benchmark::kMicrosecond);

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    return kvcache::bench::runBenchmarks(argc, argv, "kvcache-bench-step-arguments", [] {});
}
