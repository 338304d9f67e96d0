#pragma once

// Whether a GPU is usable here, and whether one is required (KVCACHE_REQUIRE_GPU=1). No GoogleTest: benchmarks use it.

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace kvcache::test
{

//! True when KVCACHE_REQUIRE_GPU=1: a GPU test or program must then fail, not skip, when no GPU is usable.
inline bool gpuRequired()
{
    char const* value = std::getenv("KVCACHE_REQUIRE_GPU");
    return value != nullptr && std::string_view(value) == "1";
}

//! Returns why no GPU can be used here, or an empty string when one can.
inline std::string gpuUnavailableReason()
{
    int count = 0;
    cudaError_t const status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess)
    {
        cudaGetLastError();
        return std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(status) + " ("
            + cudaGetErrorString(status) + ")";
    }
    if (count == 0)
    {
        return "no CUDA device is visible";
    }
    return {};
}

} // namespace kvcache::test
