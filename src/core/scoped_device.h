#pragma once

#include "kvcache/core/errors.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvcache::rt::detail
{

//! Makes `device` current for its lifetime and restores the previous device afterwards; never throws (a failed switch
//! is logged).
class ScopedDevice
{
public:
    explicit ScopedDevice(int32_t device) noexcept
    {
        if (KVCACHE_CUDA_LOG(cudaGetDevice(&mPrevious)) == cudaSuccess && mPrevious != device)
        {
            mSwitched = KVCACHE_CUDA_LOG(cudaSetDevice(device)) == cudaSuccess;
        }
    }
    ~ScopedDevice() noexcept
    {
        if (mSwitched)
        {
            KVCACHE_CUDA_LOG(cudaSetDevice(mPrevious));
        }
    }
    ScopedDevice(ScopedDevice const&) = delete;
    ScopedDevice& operator=(ScopedDevice const&) = delete;

private:
    int mPrevious{0};
    bool mSwitched{false};
};

} // namespace kvcache::rt::detail
