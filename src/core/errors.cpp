#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace kvcache::rt::detail
{

void throwCudaError(cudaError_t status, char const* call, char const* file, int line)
{
    // Clear the runtime's last error so a later, unrelated check does not report this failure again.
    cudaGetLastError();
    std::string message = fmt::format(
        "CUDA error {} ({}) from {} at {}:{}", cudaGetErrorName(status), cudaGetErrorString(status), call, file, line);
    if (status == cudaErrorMemoryAllocation)
    {
        throw OutOfMemoryError(message);
    }
    throw CudaError(status, message);
}

cudaError_t logCudaError(cudaError_t status, char const* call, char const* file, int line) noexcept
{
    if (status != cudaSuccess)
    {
        cudaGetLastError();
        std::fprintf(stderr, "kvcache: CUDA error %s (%s) from %s at %s:%d\n", cudaGetErrorName(status),
            cudaGetErrorString(status), call, file, line);
    }
    return status;
}

void failIndex(char const* what, char const* noun, long long index, long long count) noexcept
{
    std::fprintf(stderr, "kvcache: %s: %s index %lld is out of range [0, %lld)\n", what, noun, index, count);
    std::abort();
}

} // namespace kvcache::rt::detail
