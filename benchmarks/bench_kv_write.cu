// Token write (rt::writeTokens) against baselines measured in the same run with events:
//  - prefill: 8192 tokens of 8 KV heads x 128, float16, into 16-token pages at random page ids, against one contiguous
//    cudaMemcpyAsync of the same bytes (K and V: each byte read once and written once, as the write does);
//  - decode: 256 tokens of one layer against an empty kernel launch plus the bytes at the copy's rate, and the host
//    time one writeTokens call takes to enqueue;
//  - shapes: head dims 64/128/256/576 with 1-16 heads, each moving the prefill's bytes (8192 x 8 x 128 elements of K
//    and of V, so 64 MiB of traffic, beyond the 50 MiB L2: fewer bytes would partly stay in L2 between repetitions
//    and read faster than HBM allows), as a time ratio to the uniform 8 x 128;
//  - quantized: the prefill and decode writes into FP8 per token-head and NVFP4 caches (the write quantizes), the
//    prefill against a contiguous copy moving as many bytes (float16 input read, codes and scales written: the rate
//    column counts half of that traffic, as the copy's does), the decode against the unquantized decode write (each
//    timed seven times in turn; the row gives the medians);
//  - counters: the prefill and decode writes into FP8 per tensor, FP8 per token-head and NVFP4 caches with write
//    counters (TokenOpOptions::deviceCounters) against the same write without them, timed in turn seven times each
//    (medians); the target is a ratio of at most 1.053 (the counted write at >= 95% of the uncounted one's speed).
// Each unquantized write is checked once by reading it back (readTokens) before it is timed; the quantized ones are
// checked bit for bit by tests/test_kv_write_quant.cu. Prints one table; exits 77 without a
// GPU (1 under KVCACHE_REQUIRE_GPU=1). Flags: --reps=N (default 50) launches a timing; --smoke (5 reps, prefill and
// decode only).

#include "event_timing.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/kv_write.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/gpu_availability.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::bench::eventSeconds;
using kvcache::bench::median;
using kvcache::test::CudaStream;
using kvcache::test::DeviceArray;

constexpr int32_t kTOKENS_PER_PAGE = 16;
constexpr int64_t kPREFILL_TOKENS = 8192;
constexpr int64_t kDECODE_TOKENS = 256;
//! Turns of the quantized decode write against the unquantized one.
constexpr int32_t kDECODE_ROUNDS = 7;

int32_t gReps = 50;

__global__ void emptyKernel()
{
}

//! Seconds one call of `enqueue` takes on the GPU: `gReps` calls back to back between two events, after two warm-ups.
double secondsPerCall(cudaStream_t stream, std::function<void()> const& enqueue)
{
    kvcache::test::CudaEvent const start(cudaEventDefault);
    kvcache::test::CudaEvent const stop(cudaEventDefault);
    enqueue();
    enqueue();
    double const seconds = eventSeconds(stream, start.get(), stop.get(),
        [&]
        {
            for (int32_t r = 0; r < gReps; ++r)
            {
                enqueue();
            }
        });
    return seconds / gReps;
}

//! One layer of `heads` x `dim` float16 with room for kPREFILL_TOKENS tokens, inputs of `tokens` tokens and their
//! addresses on randomly ordered pages.
struct WriteSetup
{
    WriteSetup(int32_t heads, int32_t dim, int64_t tokens, cudaStream_t stream,
        rt::KVQuantization quantization = rt::KVQuantization::kNONE)
        : manager(kvcache::test::ConfigBuilder({{heads, dim}})
                      .maxSequenceLength(static_cast<int32_t>(std::max(tokens, kPREFILL_TOKENS)))
                      .tokensPerPage(kTOKENS_PER_PAGE)
                      .dataType(storageOf(quantization))
                      .quantization(quantization)
                      .build(),
            stream)
        , quantization(quantization)
        , tokens(tokens)
        , heads(heads)
        , elements(tokens * heads * dim)
        , k(static_cast<size_t>(elements))
        , v(static_cast<size_t>(elements))
        , addresses(static_cast<size_t>(tokens))
        , kTensor(k.get(), rt::Coords{tokens, heads, dim}, rt::DataType::kHALF, rt::DeviceType::kGPU)
        , vTensor(v.get(), rt::Coords{tokens, heads, dim}, rt::DataType::kHALF, rt::DeviceType::kGPU)
    {
        std::mt19937_64 rng(1);
        std::vector<uint16_t> values(static_cast<size_t>(elements));
        for (DeviceArray<uint16_t>* array : {&k, &v})
        {
            std::generate(values.begin(), values.end(), [&] { return static_cast<uint16_t>(rng() & 0x3FFF); });
            array->upload(values, stream);
        }
        std::vector<int32_t> pages(static_cast<size_t>(manager.numPages()));
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), rng);
        std::vector<int64_t> hostAddresses(static_cast<size_t>(tokens));
        for (int64_t i = 0; i < tokens; ++i)
        {
            hostAddresses[static_cast<size_t>(i)] =
                int64_t{pages[static_cast<size_t>(i / kTOKENS_PER_PAGE)]} * kTOKENS_PER_PAGE + i % kTOKENS_PER_PAGE;
        }
        addresses.upload(hostAddresses, stream);
        if (quantization == rt::KVQuantization::kNVFP4)
        {
            manager.setLayerScales(0, rt::LayerScales{2.0F / (448.0F * 6.0F), 2.0F / (448.0F * 6.0F)});
        }
    }

    static rt::DataType storageOf(rt::KVQuantization quantization)
    {
        switch (quantization)
        {
        case rt::KVQuantization::kNONE: return rt::DataType::kHALF;
        case rt::KVQuantization::kNVFP4: return rt::DataType::kUINT8;
        default: return rt::DataType::kFP8_E4M3;
        }
    }

    //! Writes the tokens, counting into `counters` (device memory) unless it is nullptr.
    void write(cudaStream_t stream, rt::WriteCounters* counters = nullptr) const
    {
        rt::TokenOpOptions options;
        options.deviceCounters = counters;
        rt::writeTokens(manager, 0, kTensor, vTensor, addresses.get(), stream, options);
    }
    //! Bytes the write moves: K and V, each read once and written once.
    int64_t bytes() const
    {
        return 2 * elements * static_cast<int64_t>(sizeof(uint16_t));
    }
    //! Bytes a quantizing write reads and writes: the float16 input, the codes and the scales, K and V.
    int64_t trafficBytes() const
    {
        int64_t const input = 2 * elements * static_cast<int64_t>(sizeof(uint16_t));
        switch (quantization)
        {
        case rt::KVQuantization::kNVFP4: return input + 2 * (elements / 2 + elements / 16);
        case rt::KVQuantization::kFP8_PER_TOKEN_HEAD: return input + 2 * (elements + tokens * heads * 4);
        case rt::KVQuantization::kFP8_PER_TENSOR: return input + 2 * elements;
        default: return 2 * input;
        }
    }
    //! Writes, reads back and compares with the inputs; throws on a difference.
    void check(cudaStream_t stream) const
    {
        write(stream);
        DeviceArray<uint16_t> kBack(static_cast<size_t>(elements));
        DeviceArray<uint16_t> vBack(static_cast<size_t>(elements));
        rt::Tensor const kOut(kBack.get(), kTensor.getShape(), rt::DataType::kHALF, rt::DeviceType::kGPU);
        rt::Tensor const vOut(vBack.get(), vTensor.getShape(), rt::DataType::kHALF, rt::DeviceType::kGPU);
        rt::readTokens(manager, 0, kOut, vOut, addresses.get(), stream);
        if (kBack.download(stream) != k.download(stream) || vBack.download(stream) != v.download(stream))
        {
            throw std::runtime_error("the tokens read back differ from those written");
        }
    }

    rt::KVCacheManager manager;
    rt::KVQuantization quantization;
    int64_t tokens;
    int64_t heads;
    int64_t elements;
    DeviceArray<uint16_t> k;
    DeviceArray<uint16_t> v;
    DeviceArray<int64_t> addresses;
    rt::Tensor kTensor;
    rt::Tensor vTensor;
};

//! Seconds one contiguous device copy of `bytes` takes (read once, written once).
double copySeconds(int64_t bytes, cudaStream_t stream)
{
    DeviceArray<uint8_t> from(static_cast<size_t>(bytes));
    DeviceArray<uint8_t> to(static_cast<size_t>(bytes));
    return secondsPerCall(stream,
        [&]
        {
            KVCACHE_CUDA_TRY(
                cudaMemcpyAsync(to.get(), from.get(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
        });
}

void printRow(
    char const* what, std::string const& shape, double seconds, int64_t bytes, double baseline, char const* of)
{
    std::printf("%-10s %-24s %10.2f us %9.1f GB/s %8.3f x %s\n", what, shape.c_str(), seconds * 1e6,
        static_cast<double>(bytes) / seconds * 1e-9, seconds / baseline, of);
}

int run(bool smoke)
{
    CudaStream stream;
    cudaStream_t const s = stream.get();
    std::printf("%-10s %-24s %13s %14s %10s %s\n", "case", "shape", "time", "rate", "ratio", "baseline");

    WriteSetup const prefill(8, 128, kPREFILL_TOKENS, s);
    prefill.check(s);
    double const copy = copySeconds(prefill.bytes(), s);
    double const prefillWrite = secondsPerCall(s, [&] { prefill.write(s); });
    printRow("prefill", "8x128 f16", prefillWrite, prefill.bytes(), copy, "(contiguous copy of the same bytes)");

    WriteSetup const decode(8, 128, kDECODE_TOKENS, s);
    decode.check(s);
    double const launch = secondsPerCall(s,
        [&]
        {
            emptyKernel<<<1, 32, 0, s>>>();
            KVCACHE_CUDA_TRY(cudaGetLastError());
        });
    double const floor = launch + static_cast<double>(decode.bytes()) * copy / static_cast<double>(prefill.bytes());
    double const decodeWrite = secondsPerCall(s, [&] { decode.write(s); });
    printRow("decode", "8x128 f16", decodeWrite, decode.bytes(), floor, "(empty launch + bytes at copy rate)");
    auto const start = std::chrono::steady_clock::now();
    for (int32_t r = 0; r < gReps; ++r)
    {
        decode.write(s);
    }
    double const enqueue = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / gReps;
    stream.synchronize();
    std::printf("%-10s %-24s %10.2f us (host, one writeTokens call)\n", "enqueue", "8x128 f16", enqueue * 1e6);
    for (rt::KVQuantization const quantization : {rt::KVQuantization::kFP8_PER_TOKEN_HEAD, rt::KVQuantization::kNVFP4})
    {
        std::string const name = std::string(rt::kvQuantizationName(quantization));
        WriteSetup const quantized(8, 128, kPREFILL_TOKENS, s, quantization);
        int64_t const traffic = quantized.trafficBytes();
        // A copy of traffic / 2 bytes reads and writes traffic bytes in all.
        double const sameTraffic = copySeconds(traffic / 2, s);
        double const write = secondsPerCall(s, [&] { quantized.write(s); });
        printRow("prefill", name + " f16", write, traffic / 2, sameTraffic, "(contiguous copy moving as many bytes)");
        // Launch-bound writes of a few microseconds drift with the clocks between timings: the quantized decode write
        // and the unquantized one are timed in turn, kDECODE_ROUNDS times each, and their medians compared.
        WriteSetup const quantizedDecode(8, 128, kDECODE_TOKENS, s, quantization);
        std::vector<double> quantizedTimes;
        std::vector<double> plainTimes;
        for (int32_t round = 0; round < kDECODE_ROUNDS; ++round)
        {
            quantizedTimes.push_back(secondsPerCall(s, [&] { quantizedDecode.write(s); }));
            plainTimes.push_back(secondsPerCall(s, [&] { decode.write(s); }));
        }
        printRow("decode", name + " f16", median(quantizedTimes), quantizedDecode.trafficBytes() / 2,
            median(plainTimes), "(unquantized decode write, medians of turns)");
    }
    DeviceArray<rt::WriteCounters> counters(std::vector<rt::WriteCounters>{rt::WriteCounters{}}, s);
    for (rt::KVQuantization const quantization :
        {rt::KVQuantization::kFP8_PER_TENSOR, rt::KVQuantization::kFP8_PER_TOKEN_HEAD, rt::KVQuantization::kNVFP4})
    {
        std::string const name = std::string(rt::kvQuantizationName(quantization));
        for (int64_t const tokens : {kPREFILL_TOKENS, kDECODE_TOKENS})
        {
            // Counted and uncounted writes timed in turn, so that clock drift between timings falls on both.
            WriteSetup const setup(8, 128, tokens, s, quantization);
            std::vector<double> countedTimes;
            std::vector<double> plainTimes;
            for (int32_t round = 0; round < kDECODE_ROUNDS; ++round)
            {
                countedTimes.push_back(secondsPerCall(s, [&] { setup.write(s, counters.get()); }));
                plainTimes.push_back(secondsPerCall(s, [&] { setup.write(s); }));
            }
            printRow("counters", name + (tokens == kPREFILL_TOKENS ? " prefill" : " decode"), median(countedTimes),
                setup.trafficBytes() / 2, median(plainTimes), "(the write without counters, medians; target <= 1.053)");
        }
    }
    if (smoke)
    {
        return 0;
    }

    double const uniformRate = static_cast<double>(prefill.bytes()) / prefillWrite;
    for (int32_t const dim : {64, 128, 256, 576})
    {
        for (int32_t const heads : {1, 2, 4, 8, 16})
        {
            // The prefill's elements, in whole tokens of this shape.
            int64_t const tokens = kPREFILL_TOKENS * 8 * 128 / (int64_t{heads} * dim);
            WriteSetup const shaped(heads, dim, tokens, s);
            shaped.check(s);
            double const seconds = secondsPerCall(s, [&] { shaped.write(s); });
            // As a time ratio at the uniform case's rate for these bytes.
            double const atUniformRate = static_cast<double>(shaped.bytes()) / uniformRate;
            printRow("shape", std::to_string(heads) + "x" + std::to_string(dim) + " f16", seconds, shaped.bytes(),
                atUniformRate, "(uniform 8x128's rate)");
        }
    }
    return 0;
}

//! Reads the flags into gReps; returns whether to run the short smoke version, or throws std::invalid_argument.
bool parseFlags(int argc, char** argv)
{
    bool smoke = false;
    for (int i = 1; i < argc; ++i)
    {
        std::string const flag = argv[i];
        if (flag.rfind("--reps=", 0) == 0)
        {
            gReps = std::max(1, std::atoi(flag.c_str() + 7));
        }
        else if (flag == "--smoke")
        {
            smoke = true;
            gReps = 5;
        }
        else
        {
            throw std::invalid_argument("unknown flag " + flag + "; usage: [--reps=N] [--smoke]");
        }
    }
    return smoke;
}

} // namespace

int main(int argc, char** argv)
{
    try
    {
        bool const smoke = parseFlags(argc, argv);
        if (std::string const reason = kvcache::test::gpuUnavailableReason(); !reason.empty())
        {
            std::printf("skipped: %s\n", reason.c_str());
            return kvcache::test::gpuRequired() ? 1 : 77;
        }
        return run(smoke);
    }
    catch (std::exception const& error)
    {
        std::fprintf(stderr, "kvcache-bench-kv-write: %s\n", error.what());
        return 1;
    }
}
