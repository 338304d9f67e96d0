#pragma once

// A stream held back by a spinning kernel, so that work queued after it is still in flight when a test looks: what
// the tests of stream-ordering guarantees (a transfer on another stream waiting for one in flight) build on.

#include "kvcache/core/errors.h"

#include <cuda_runtime_api.h>

#include "support/cuda_raii.h"

namespace kvcache::test
{

//! Spins one thread for about `cycles` clock cycles.
__global__ inline void spinKernel(long long cycles)
{
    long long const start = clock64();
    while (clock64() - start < cycles)
    {
    }
}

//! Holds `stream` back with a spin of about a tenth of a second; released() says whether the spin is over (under a
//! sanitizer it may be, early), so a test can tell "not waited for" from "done already".
class HeldStream
{
public:
    explicit HeldStream(cudaStream_t stream)
    {
        spinKernel<<<1, 1, 0, stream>>>(200'000'000LL);
        KVCACHE_CUDA_TRY(cudaGetLastError());
        mSpinDone.record(stream);
    }

    bool released() const
    {
        return cudaEventQuery(mSpinDone.get()) == cudaSuccess;
    }

private:
    CudaEvent mSpinDone;
};

} // namespace kvcache::test
