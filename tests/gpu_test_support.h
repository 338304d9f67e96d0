#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace kvcache::test
{

//! True when KVCACHE_REQUIRE_GPU=1: a GPU test must then fail, not skip, when no GPU is usable.
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

//! Typed variant of GpuTest for typed tests over data types.
template <typename T>
class TypedGpuTest : public GpuTest
{
};

} // namespace kvcache::test

//! Throws-free check of a CUDA call inside a test: records a fatal failure naming the call and CUDA's error.
#define KVCACHE_TEST_CUDA(call)                                                                                        \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const kvcacheTestStatus_ = (call);                                                                 \
        ASSERT_EQ(kvcacheTestStatus_, cudaSuccess) << #call << ": " << cudaGetErrorName(kvcacheTestStatus_);           \
    } while (0)
