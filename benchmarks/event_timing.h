#pragma once

// What the GPU benchmark programs share to time work on a stream: the seconds between two CUDA events recorded around
// the work, and the median of repeated timings.

#include "kvcache/core/errors.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvcache::bench
{

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
