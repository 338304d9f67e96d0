// Calibration on the host, without a GPU: the scales calibratedScales gives for observed amax against values worked
// out by hand from docs/layout.md ("Calibration"), its refusals with their named errors, and planTokenOp's refusals of
// write counters where they do not apply (a read, a cache that is not quantized, a misaligned pointer).

#include "memory/kv_write/token_op_plan.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/kv_write.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace
{

namespace rt = kvcache::rt;
namespace detail = kvcache::rt::detail;
using kvcache::test::throwsNaming;
using Q = rt::KVQuantization;

constexpr float kNAN = std::numeric_limits<float>::quiet_NaN();
constexpr float kINF = std::numeric_limits<float>::infinity();

TEST(Calibration, Fp8PerTensorScalesAreAmaxOver448)
{
    // 448 / 448 = 1 and 896 / 448 = 2: the largest value lands on E4M3's largest code, 448.
    rt::LayerScales const whole = rt::calibratedScales(Q::kFP8_PER_TENSOR, 448.0F, 896.0F);
    EXPECT_EQ(whole.k, 1.0F);
    EXPECT_EQ(whole.v, 2.0F);
    // 3.5 / 448 = 1 / 128 exactly; 7 / 448 = 1 / 64.
    rt::LayerScales const small = rt::calibratedScales(Q::kFP8_PER_TENSOR, 3.5F, 7.0F);
    EXPECT_EQ(small.k, 0.0078125F);
    EXPECT_EQ(small.v, 0.015625F);
    // 1 / 448 = (1 / 7) * 2^-6 = 1.001001...b * 2^-9; its 23 mantissa bits 00100100100100100100100 are followed by
    // 1001..., more than half an ulp, so the quotient rounds up to mantissa 0x124925: float bits 0x3B124925.
    EXPECT_EQ(rt::calibratedScales(Q::kFP8_PER_TENSOR, 1.0F, 1.0F).k, 0x1.24924Ap-9F);
}

TEST(Calibration, Nvfp4GlobalScalesAreAmaxOver448Times6)
{
    // 448 * 6 = 2688: 2688 / 2688 = 1, 5376 / 2688 = 2, 21 / 2688 = 1 / 128.
    rt::LayerScales const scales = rt::calibratedScales(Q::kNVFP4, 2688.0F, 5376.0F);
    EXPECT_EQ(scales.k, 1.0F);
    EXPECT_EQ(scales.v, 2.0F);
    EXPECT_EQ(rt::calibratedScales(Q::kNVFP4, 21.0F, 42.0F).k, 0.0078125F);
    EXPECT_EQ(rt::calibratedScales(Q::kNVFP4, 21.0F, 42.0F).v, 0.015625F);
}

TEST(Calibration, ALatentLayerLeavesVAndDoesNotCheckItsAmax)
{
    rt::LayerScales const scales = rt::calibratedScales(Q::kNVFP4, 2688.0F, kNAN, false);
    EXPECT_EQ(scales.k, 1.0F);
    EXPECT_EQ(scales.v, 1.0F);
}

TEST(Calibration, FormatsWithoutHostScalesAreRefusedNamingTheQuantization)
{
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [] { rt::calibratedScales(Q::kNONE, 1.0F, 1.0F); }, {"calibratedScales", "none", "fp8_per_tensor and nvfp4"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [] { rt::calibratedScales(Q::kFP8_PER_TOKEN_HEAD, 1.0F, 1.0F); }, {"calibratedScales", "fp8_per_token_head"}));
}

TEST(Calibration, AmaxThatIsNotFiniteAndPositiveIsRefusedNamingTheField)
{
    for (Q const quantization : {Q::kFP8_PER_TENSOR, Q::kNVFP4})
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::calibratedScales(quantization, 0.0F, 1.0F); }, {"kAmax is 0", "> 0", "no value was observed"}));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::calibratedScales(quantization, 1.0F, kNAN); }, {"vAmax is nan", "finite"}));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::calibratedScales(quantization, kINF, 1.0F); }, {"kAmax is inf", "finite"}));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::calibratedScales(quantization, 1.0F, -2.0F); }, {"vAmax is -2", "> 0"}));
    }
    // The smallest subnormal over 448 rounds to 0 in float32.
    float const tiny = std::numeric_limits<float>::denorm_min();
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::calibratedScales(Q::kFP8_PER_TENSOR, tiny, 1.0F); }, {"kAmax", "448", "underflows"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::calibratedScales(Q::kNVFP4, 1.0F, tiny); }, {"vAmax", "2688", "underflows"}));
}

rt::KVCacheLayout layoutOf(Q quantization)
{
    rt::DataType const storage = quantization == Q::kNVFP4 ? rt::DataType::kUINT8
        : quantization == Q::kNONE                         ? rt::DataType::kHALF
                                                           : rt::DataType::kFP8_E4M3;
    return rt::KVCacheManager::validate(kvcache::test::ConfigBuilder(
        {{2, 64}}).maxBatchSize(2)
                                            .maxSequenceLength(64)
                                            .tokensPerPage(16)
                                            .dataType(storage)
                                            .quantization(quantization)
                                            .build());
}

rt::Tensor tokens()
{
    return rt::Tensor(reinterpret_cast<void*>(uintptr_t{0x10000000}), rt::Coords{4, 2, 64}, rt::DataType::kHALF,
        rt::DeviceType::kGPU);
}

TEST(Calibration, WriteCountersAreRefusedWhereNothingIsQuantized)
{
    rt::TokenOpOptions options;
    options.deviceCounters = reinterpret_cast<rt::WriteCounters*>(uintptr_t{0x20000000});
    rt::Tensor const k = tokens();
    rt::Tensor const v = tokens();
    // A quantized write takes them.
    EXPECT_NO_THROW(
        detail::planTokenOp("writeTokens", layoutOf(Q::kNVFP4), 0, k, v, options, detail::TokenDirection::kWRITE));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            detail::planTokenOp(
                "readTokens", layoutOf(Q::kFP8_PER_TENSOR), 0, k, v, options, detail::TokenDirection::kREAD);
        },
        {"readTokens", "options.deviceCounters", "a read records nothing"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { detail::planTokenOp("writeTokens", layoutOf(Q::kNONE), 0, k, v, options, detail::TokenDirection::kWRITE); },
        {"writeTokens", "options.deviceCounters", "quantization none"}));
    options.deviceCounters = reinterpret_cast<rt::WriteCounters*>(uintptr_t{0x20000004});
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&]
        {
            detail::planTokenOp(
                "writeTokens", layoutOf(Q::kFP8_PER_TOKEN_HEAD), 0, k, v, options, detail::TokenDirection::kWRITE);
        },
        {"options.deviceCounters", "0x20000004", "8-byte aligned"}));
}

} // namespace
