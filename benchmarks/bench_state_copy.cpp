// State slot copies (copyStates) of Qwen3-Next-80B's state layers against one cudaMemcpyAsync of the same bytes,
// contiguous: one sequence's fork and batches of copies. Exits 77 without a GPU (1 under KVCACHE_REQUIRE_GPU=1).
// See docs/benchmarks.md, "State copies".

#include "bench_main.h"
#include "event_timing.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/gpu_availability.h"

namespace kvcache::bench
{
namespace
{

//! Qwen3-Next-80B-A3B: 36 gated delta net layers, each a conv state [2 * 16 * 128 + 32 * 128, 3] = [8192, 3] bfloat16
//! (48 KiB a sequence) and a recurrent state [32, 128, 128] float32 (2 MiB a sequence): 36 x 2,146,304 = 77,266,944
//! bytes a sequence. One attention layer stands for the model's (state copies never touch it).
constexpr int32_t kSTATE_LAYERS = 36;
constexpr int32_t kSLOTS = 64;
//! Destinations start here; sources are slots [0, copies).
constexpr int32_t kFIRST_DESTINATION = 32;

rt::KVCacheConfig qwen3NextConfig()
{
    std::vector<rt::StateLayerConfig> const layers(static_cast<size_t>(kSTATE_LAYERS),
        rt::StateLayerConfig{
            {{"conv", {8192, 3}, rt::DataType::kBF16}, {"recurrent", {32, 128, 128}, rt::DataType::kFLOAT}}});
    return test::ConfigBuilder({{2, 256}})
        .dataType(rt::DataType::kBF16)
        .maxBatchSize(kSLOTS)
        .maxSequenceLength(16)
        .tokensPerPage(16)
        .stateLayers(layers)
        .build();
}

//! The cache and a contiguous source and destination of the bytes of the largest batch, made once.
struct Setup
{
    test::CudaStream stream;
    rt::KVCacheManager cache{qwen3NextConfig(), stream.get()};
    int64_t bytesPerCopy = cache.layout().stateBytesPerSlot;
    test::DeviceArray<char> contiguousSource{static_cast<size_t>(bytesPerCopy * kFIRST_DESTINATION)};
    test::DeviceArray<char> contiguousDestination{static_cast<size_t>(bytesPerCopy * kFIRST_DESTINATION)};
};

Setup& setup()
{
    static std::unique_ptr<Setup> const instance = std::make_unique<Setup>();
    return *instance;
}

//! Times `enqueue` with CUDA events behind a hold of the stream: the seconds of one call, the median of `reps` calls
//! after a warm-up.
template <typename Enqueue>
double secondsPerCall(cudaStream_t stream, Enqueue&& enqueue, int32_t reps = 7)
{
    test::CudaEvent const start(cudaEventDefault);
    test::CudaEvent const stop(cudaEventDefault);
    enqueue();
    std::vector<double> times;
    for (int32_t r = 0; r < reps; ++r)
    {
        holdStream(stream);
        times.push_back(eventSeconds(stream, start.get(), stop.get(), enqueue));
    }
    return median(std::move(times));
}

void measureCopies(benchmark::State& state, int32_t count)
{
    guarded(state,
        [&]
        {
            Setup& s = setup();
            std::vector<rt::StateSlotCopy> copies;
            for (int32_t i = 0; i < count; ++i)
            {
                copies.push_back({i, kFIRST_DESTINATION + i});
            }
            int64_t const bytes = s.bytesPerCopy * count;
            cudaStream_t const stream = s.stream.get();
            double kernelSeconds = 0;
            double memcpySeconds = 0;
            for (auto _ : state)
            {
                kernelSeconds = secondsPerCall(stream, [&] { rt::copyStates(s.cache, copies, stream); });
                memcpySeconds = secondsPerCall(stream,
                    [&]
                    {
                        KVCACHE_CUDA_TRY(cudaMemcpyAsync(s.contiguousDestination.get(), s.contiguousSource.get(),
                            static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
                    });
                state.SetIterationTime(kernelSeconds);
            }
            // The last copy's recurrent state of the last layer must equal its source.
            rt::Tensor const recurrent = s.cache.stateView(kSTATE_LAYERS - 1, "recurrent");
            int64_t const slotBytes = s.cache.layout().stateLayers.back().tensors.back().slotBytes;
            auto const* const base = static_cast<char const*>(recurrent.rawPointer());
            check(test::downloadBytes(base + (count - 1) * slotBytes, slotBytes, stream)
                    == test::downloadBytes(base + (kFIRST_DESTINATION + count - 1) * slotBytes, slotBytes, stream),
                "the last copy's destination differs from its source");
            state.counters["copies"] = count;
            state.counters["bytes"] = static_cast<double>(bytes);
            state.counters["copy_states_GBps"] = static_cast<double>(bytes) / kernelSeconds * 1e-9;
            state.counters["memcpy_GBps"] = static_cast<double>(bytes) / memcpySeconds * 1e-9;
            // The target: at least 0.95.
            state.counters["ratio_to_memcpy"] = memcpySeconds / kernelSeconds;
        });
}

void registerAll()
{
    for (int32_t const count : {1, 8, 32})
    {
        benchmark::RegisterBenchmark(("qwen3_next_80b/copies:" + std::to_string(count)).c_str(),
            [count](benchmark::State& state) { measureCopies(state, count); })
            ->UseManualTime()
            ->Iterations(3)
            ->Unit(benchmark::kMicrosecond);
    }
}

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    std::string const reason = kvcache::test::gpuUnavailableReason();
    if (!reason.empty())
    {
        std::fprintf(stderr, "kvcache-bench-state-copy: needs a GPU: %s\n", reason.c_str());
        return kvcache::test::gpuRequired() ? 1 : 77;
    }
    return kvcache::bench::runBenchmarks(argc, argv, "kvcache-bench-state-copy", kvcache::bench::registerAll);
}
