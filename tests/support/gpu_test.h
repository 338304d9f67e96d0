#pragma once

// GoogleTest fixtures for GPU tests: skip with the reason where no GPU is usable, fail under KVCACHE_REQUIRE_GPU=1.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

#include "support/gpu_availability.h"

namespace kvcache::test
{

//! Base fixture of every GPU test: skips with the reason when there is no GPU, fails under KVCACHE_REQUIRE_GPU=1.
class GpuTest : public ::testing::Test
{
protected:
    void SetUp() override
    {
        std::string const reason = gpuUnavailableReason();
        if (reason.empty())
        {
            return;
        }
        if (gpuRequired())
        {
            GTEST_FAIL() << "KVCACHE_REQUIRE_GPU=1 but no GPU is usable: " << reason;
        }
        GTEST_SKIP() << "needs a GPU: " << reason << " (set KVCACHE_REQUIRE_GPU=1 to make this a failure)";
    }
};

//! Typed variant of GpuTest for typed tests (see support/data_types.h).
template <typename T>
class TypedGpuTest : public GpuTest
{
};

} // namespace kvcache::test

//! Checks a CUDA call inside a test without throwing: records a fatal failure naming the call and CUDA's error.
#define KVCACHE_TEST_CUDA(call)                                                                                        \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const kvcacheTestStatus_ = (call);                                                                 \
        ASSERT_EQ(kvcacheTestStatus_, cudaSuccess) << #call << ": " << cudaGetErrorName(kvcacheTestStatus_);           \
    } while (0)
