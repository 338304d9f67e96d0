#pragma once

// What the GPU benchmark programs share to time work on a stream: a hold of the stream while the host enqueues, the
// seconds between two CUDA events recorded around the work, and the median of repeated timings.

#include "kvcache/core/errors.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

namespace kvcache::bench
{

//! Holds `stream` on the host for 200 us (a host function), long enough for the host to enqueue what follows, so that
//! the events around it time the GPU's work alone, not the host's enqueueing (as in a serving loop whose host runs
//! ahead). Needs no kernel, so programs without CUDA sources use it too.
inline void holdStream(cudaStream_t stream)
{
    KVCACHE_CUDA_TRY(cudaLaunchHostFunc(
        stream, [](void*) { std::this_thread::sleep_for(std::chrono::microseconds(200)); }, nullptr));
}

//! Records `start`, runs `enqueue`, records `stop` on `stream`, waits for `stop` and returns the seconds between them.
//! Both events must be created with timing on.
template <typename Enqueue>
double eventSeconds(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, Enqueue&& enqueue)
{
    KVCACHE_CUDA_TRY(cudaEventRecord(start, stream));
    enqueue();
    KVCACHE_CUDA_TRY(cudaEventRecord(stop, stream));
    KVCACHE_CUDA_TRY(cudaEventSynchronize(stop));
    float milliseconds = 0;
    KVCACHE_CUDA_TRY(cudaEventElapsedTime(&milliseconds, start, stop));
    return milliseconds * 1e-3;
}

//! The median of `values` (the upper one of an even count); `values` must not be empty.
inline double median(std::vector<double> values)
{
    auto const middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
    std::nth_element(values.begin(), middle, values.end());
    return *middle;
}

} // namespace kvcache::bench
