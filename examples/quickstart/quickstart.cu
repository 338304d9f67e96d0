// kvcache quickstart: own the KV cache of a small model whose attention layers have different shapes, write a few
// sequences into it, fork one sequence into another batch slot, reset the pages of a finished sequence, and check
// every byte of every layer against a model of what the cache must hold.
//
// Run: kvcache-quickstart   (exits 77 without a GPU, or 1 when KVCACHE_REQUIRE_GPU=1 is set)

#include <kvcache/kvcache.h>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace
{

namespace rt = kvcache::rt;

//! Exit status that ctest reports as "skipped".
constexpr int kEXIT_SKIPPED = 77;
//! Threads per block of the token-writing kernel.
constexpr int32_t kWRITE_THREADS = 128;
//! Byte the whole cache is cleared to first, so that untouched memory has a known, nonzero value.
constexpr int kBACKGROUND_BYTE = 0xA5;
//! What resetPages writes: float16 -0.5 (0xB800) in the low half-word, float16 1.5 (0x3E00) in the high one.
constexpr uint32_t kRESET_PATTERN = 0x3E00B800u;

//! Returns why no GPU can be used, or an empty string when one can.
std::string gpuUnavailableReason()
{
    int count = 0;
    cudaError_t const status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess)
    {
        cudaGetLastError();
        return std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(status);
    }
    return count == 0 ? std::string("no CUDA device is visible") : std::string();
}

//! Returns true when KVCACHE_REQUIRE_GPU=1, which turns a missing GPU from a skip into a failure.
bool gpuRequired()
{
    char const* value = std::getenv("KVCACHE_REQUIRE_GPU");
    return value != nullptr && std::string_view(value) == "1";
}

//! The value that element (head, dim) of token `token` of sequence `seq` holds in `layer`'s K (kv = 0) or V (kv = 1).
//! An integer in [1, 1000] is exact in float16; hashing all indices means a value written to the wrong place is
//! caught, and the sign keeps K and V apart.
__host__ __device__ float tokenValue(int32_t layer, int32_t kv, int32_t seq, int32_t token, int32_t head, int32_t dim)
{
    uint32_t hash = static_cast<uint32_t>(layer);
    hash = hash * 0x9E3779B1u + static_cast<uint32_t>(kv);
    hash = hash * 0x9E3779B1u + static_cast<uint32_t>(seq);
    hash = hash * 0x9E3779B1u + static_cast<uint32_t>(token);
    hash = hash * 0x9E3779B1u + static_cast<uint32_t>(head);
    hash = hash * 0x9E3779B1u + static_cast<uint32_t>(dim);
    hash ^= hash >> 15;
    hash *= 0x2C1B3C6Du;
    hash ^= hash >> 12;
    float const magnitude = static_cast<float>(1u + hash % 1000u);
    return kv == 0 ? magnitude : -magnitude;
}

//! Strides, in elements, of a [maxBatchSize, capPadded, H, D] K or V view.
struct SlotStrides
{
    int64_t slot;
    int64_t token;
    int64_t head;
    int64_t dim;
};

//! Writes tokens [0, gridDim.x) of batch slot `slot` into one layer's K and V views: one block per token, the threads
//! of a block stride over the token's numKVHeads * headDim values.
__global__ void writeTokensKernel(
    __half* k, __half* v, SlotStrides strides, int32_t layer, int32_t slot, int32_t numKVHeads, int32_t headDim)
{
    int32_t const token = static_cast<int32_t>(blockIdx.x);
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < numKVHeads * headDim; i += static_cast<int32_t>(blockDim.x))
    {
        int32_t const head = i / headDim;
        int32_t const dim = i % headDim;
        int64_t const offset = slot * strides.slot + token * strides.token + head * strides.head + dim * strides.dim;
        k[offset] = __float2half_rn(tokenValue(layer, 0, slot, token, head, dim));
        v[offset] = __float2half_rn(tokenValue(layer, 1, slot, token, head, dim));
    }
}

//! Returns the bits of `value` rounded to float16, as the cache stores them.
uint16_t halfBits(float value)
{
    __half const h = __float2half_rn(value);
    uint16_t bits = 0;
    std::memcpy(&bits, &h, sizeof(bits));
    return bits;
}

//! Owns a CUDA stream; it must outlive the KVCacheManager that frees its memory on it.
class Stream
{
public:
    Stream()
    {
        KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&mStream, cudaStreamNonBlocking));
    }
    ~Stream()
    {
        KVCACHE_CUDA_LOG(cudaStreamDestroy(mStream));
    }
    Stream(Stream const&) = delete;
    Stream& operator=(Stream const&) = delete;

    //! Returns the stream.
    cudaStream_t get() const noexcept
    {
        return mStream;
    }

private:
    cudaStream_t mStream{nullptr};
};

//! Records a pair of CUDA events around each step's GPU work and prints the steps as a table.
class Timeline
{
public:
    explicit Timeline(cudaStream_t stream)
        : mStream(stream)
    {
    }
    ~Timeline()
    {
        for (Step const& step : mSteps)
        {
            for (cudaEvent_t event : {step.begin, step.end})
            {
                if (event != nullptr)
                {
                    KVCACHE_CUDA_LOG(cudaEventDestroy(event));
                }
            }
        }
    }
    Timeline(Timeline const&) = delete;
    Timeline& operator=(Timeline const&) = delete;

    //! Runs `work` (which enqueues GPU work on the stream) between two events, under the name `name`.
    template <typename Work>
    void time(std::string name, std::string what, Work&& work)
    {
        mSteps.push_back(Step{std::move(name), std::move(what), nullptr, nullptr});
        Step& step = mSteps.back();
        KVCACHE_CUDA_TRY(cudaEventCreate(&step.begin));
        KVCACHE_CUDA_TRY(cudaEventCreate(&step.end));
        KVCACHE_CUDA_TRY(cudaEventRecord(step.begin, mStream));
        work();
        KVCACHE_CUDA_TRY(cudaEventRecord(step.end, mStream));
    }

    //! Waits for every step and prints one row per step.
    void print() const
    {
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(mStream));
        std::printf("\n%-12s %-58s %10s\n", "step", "what it did", "time (ms)");
        for (Step const& step : mSteps)
        {
            float ms = 0.0F;
            KVCACHE_CUDA_TRY(cudaEventElapsedTime(&ms, step.begin, step.end));
            std::printf("%-12s %-58s %10.3f\n", step.name.c_str(), step.what.c_str(), static_cast<double>(ms));
        }
    }

private:
    struct Step
    {
        std::string name;
        std::string what;
        cudaEvent_t begin;
        cudaEvent_t end;
    };

    cudaStream_t mStream;
    std::vector<Step> mSteps;
};

//! Returns `bytes` as a short human-readable string ("1.50 MiB").
std::string formatBytes(int64_t bytes)
{
    char text[32];
    if (bytes >= (int64_t{1} << 20))
    {
        std::snprintf(text, sizeof(text), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
    }
    else
    {
        std::snprintf(text, sizeof(text), "%.1f KiB", static_cast<double>(bytes) / (1 << 10));
    }
    return text;
}

//! Builds the cache, runs the steps and verifies the result; returns the process exit status.
int runQuickstart()
{
    // 1. Describe the attention layers. Each layer gets its own buffer sized for its own head shape.
    rt::KVCacheManager::Config config;
    config.numAttentionLayers = 3;
    config.maxBatchSize = 4;
    config.maxSequenceLength = 300; // not a multiple of the page size: capPadded rounds it up to 320
    config.layerConfigs = {{8, 64}, {4, 128}, {2, 96}};
    config.kvCacheType = rt::DataType::kHALF;
    config.tokensPerPage = 64;

    // validate() runs the layout maths without a GPU. numPages = 0 asks for the minimum (every slot's pages); ask for
    // four more: "retained" pages, which a paged runtime can use for prefix caching or spare capacity.
    rt::KVCacheLayout const minimum = rt::KVCacheManager::validate(config);
    config.numPages = minimum.minPages + 4;

    Stream stream;
    rt::KVCacheManager cache(config, stream.get());
    rt::KVCacheLayout const& layout = cache.getLayout();
    int32_t const tokensPerPage = layout.tokensPerPage;
    int32_t const pagesPerSlot = layout.pagesPerSlot;

    std::printf("kvcache quickstart: %d layers, %s, maxBatchSize %d, maxSequenceLength %d\n", cache.numLayers(),
        rt::dataTypeName(config.kvCacheType).data(), config.maxBatchSize, config.maxSequenceLength);
    std::printf("capPadded %d = %d pages of %d tokens per slot; %d pages = %d minimum + %d retained; %s in all\n",
        cache.maxCapPadded(), pagesPerSlot, tokensPerPage, cache.numPages(), cache.minPages(),
        cache.numPages() - cache.minPages(), formatBytes(layout.cacheBytes).c_str());
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        rt::Coords const& shape = cache.getCombinedKVCachePoolView(layer).getShape();
        std::printf("  layer %d: H %d, D %d, pool view [%lld, %lld, %lld, %lld, %lld], %s\n", layer,
            cache.getLayerConfig(layer).numKVHeads, cache.getLayerConfig(layer).headDim,
            static_cast<long long>(shape[0]), static_cast<long long>(shape[1]), static_cast<long long>(shape[2]),
            static_cast<long long>(shape[3]), static_cast<long long>(shape[4]),
            formatBytes(layout.layers[layer].layerBytes).c_str());
    }

    // With retained pages the combined slot view [2, maxBatchSize, capPadded, H, D] would put V inside the K pool, so
    // the manager refuses it. getSeparateKVCache gives the same slot view as separate K and V tensors, valid always.
    try
    {
        static_cast<void>(cache.getCombinedKVCache(0));
        std::fprintf(stderr, "FAIL: getCombinedKVCache accepted a cache with retained pages\n");
        return 1;
    }
    catch (rt::InvalidConfigError const&)
    {
        std::printf(
            "getCombinedKVCache refuses a cache with retained pages, as documented; using getSeparateKVCache\n");
    }

    // The sequences to write, by batch slot. Slot 3 stays empty until it receives the fork of slot 1.
    struct Sequence
    {
        int32_t slot;
        int32_t length;
    };
    std::vector<Sequence> const sequences = {{0, 300}, {1, 130}, {2, 77}};
    Sequence const forkSource = sequences[1];
    int32_t const forkTargetSlot = 3;
    Sequence const finished = sequences[2];

    // In the slot view, token s of slot b lives on page b * pagesPerSlot + s / tokensPerPage: a sequence of n tokens
    // in slot b occupies pages [b * pagesPerSlot, b * pagesPerSlot + ceil(n / tokensPerPage)).
    auto pageOfToken = [&](int32_t slot, int32_t token) { return slot * pagesPerSlot + token / tokensPerPage; };
    int32_t const forkPages = (forkSource.length + tokensPerPage - 1) / tokensPerPage;
    std::vector<rt::PageCopy> forkPairs;
    std::string forkList;
    for (int32_t token = 0; token < forkPages * tokensPerPage; token += tokensPerPage)
    {
        forkPairs.push_back({pageOfToken(forkSource.slot, token), pageOfToken(forkTargetSlot, token)});
        forkList += std::to_string(forkPairs.back().src) + "->" + std::to_string(forkPairs.back().dst) + " ";
    }
    std::vector<int32_t> resetList;
    std::string resetText;
    for (int32_t token = 0; token < finished.length; token += tokensPerPage)
    {
        resetList.push_back(pageOfToken(finished.slot, token));
        resetText += std::to_string(resetList.back()) + " ";
    }

    Timeline timeline(stream.get());

    // 2. cudaMallocAsync memory starts undefined: give every byte a known value so "unchanged" can be checked.
    timeline.time("clear", "cudaMemsetAsync of every layer, " + formatBytes(layout.cacheBytes), [&] {
        for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
        {
            KVCACHE_CUDA_TRY(cudaMemsetAsync(cache.kPoolPtr(layer), kBACKGROUND_BYTE,
                static_cast<size_t>(layout.layers[layer].layerBytes), stream.get()));
        }
    });

    // 3. Write the sequences through the slot view: K and V are [maxBatchSize, capPadded, H, D] each.
    int64_t writtenBytes = 0;
    int32_t writtenTokens = 0;
    for (Sequence const& sequence : sequences)
    {
        writtenTokens += sequence.length;
        for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
        {
            rt::KVLayerConfig const& shape = cache.getLayerConfig(layer);
            writtenBytes += 2 * int64_t{sequence.length} * shape.numKVHeads * shape.headDim * layout.elementBytes;
        }
    }
    timeline.time("write",
        std::to_string(writtenTokens) + " tokens in " + std::to_string(sequences.size()) + " slots, slot view, "
            + formatBytes(writtenBytes),
        [&] {
            for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
            {
                auto const [k, v] = cache.getSeparateKVCache(layer);
                rt::Coords const& stride = k.getStride();
                SlotStrides const strides{stride[0], stride[1], stride[2], stride[3]};
                rt::KVLayerConfig const& shape = cache.getLayerConfig(layer);
                for (Sequence const& sequence : sequences)
                {
                    writeTokensKernel<<<sequence.length, kWRITE_THREADS, 0, stream.get()>>>(k.dataPointer<__half>(),
                        v.dataPointer<__half>(), strides, layer, sequence.slot, shape.numKVHeads, shape.headDim);
                    KVCACHE_CUDA_TRY(cudaGetLastError());
                }
            }
        });

    // 4. Fork: slot 3 continues from slot 1's prefix. copyPages copies whole pages, K and V, in every layer.
    timeline.time("fork",
        "copyPages " + forkList + "(" + std::to_string(forkPairs.size()) + " pages), "
            + formatBytes(static_cast<int64_t>(forkPairs.size()) * layout.bytesPerPage),
        [&] { rt::copyPages(cache, forkPairs, stream.get()); });

    // 5. Slot 2's sequence finished: overwrite its pages so nothing stale can be read when the slot is reused.
    timeline.time("reset",
        "resetPages " + resetText + "(" + std::to_string(resetList.size()) + " pages), "
            + formatBytes(static_cast<int64_t>(resetList.size()) * layout.bytesPerPage),
        [&] { rt::resetPages(cache, resetList, stream.get(), kRESET_PATTERN); });

    // 6. Copy every layer back to the host.
    std::vector<std::vector<uint16_t>> actual(static_cast<size_t>(cache.numLayers()));
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        actual[layer].resize(static_cast<size_t>(layout.layers[layer].layerBytes / layout.elementBytes));
    }
    timeline.time("copy back", "cudaMemcpyAsync of every layer to the host, " + formatBytes(layout.cacheBytes), [&] {
        for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
        {
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(actual[layer].data(), cache.kPoolPtr(layer),
                static_cast<size_t>(layout.layers[layer].layerBytes), cudaMemcpyDeviceToHost, stream.get()));
        }
    });
    timeline.print();

    // 7. Build, on the host, what each layer must hold, from the documented layout alone: element
    // (kv, page, t, h, d) is at kv * halfElems + ((page * P + t) * H + h) * D + d. Then compare every element.
    int64_t totalMismatches = 0;
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        int64_t const numKVHeads = cache.getLayerConfig(layer).numKVHeads;
        int64_t const headDim = cache.getLayerConfig(layer).headDim;
        int64_t const pageElems = layout.layers[layer].pageElems;
        int64_t const halfElems = layout.layers[layer].halfElems;
        uint16_t background = 0;
        std::memset(&background, kBACKGROUND_BYTE, sizeof(background));
        std::vector<uint16_t> expected(actual[layer].size(), background);

        for (Sequence const& sequence : sequences)
        {
            for (int32_t token = 0; token < sequence.length; ++token)
            {
                int64_t const page = pageOfToken(sequence.slot, token);
                for (int32_t head = 0; head < numKVHeads; ++head)
                {
                    for (int32_t dim = 0; dim < headDim; ++dim)
                    {
                        int64_t const offset =
                            ((page * tokensPerPage + token % tokensPerPage) * numKVHeads + head) * headDim + dim;
                        expected[offset] = halfBits(tokenValue(layer, 0, sequence.slot, token, head, dim));
                        expected[halfElems + offset] = halfBits(tokenValue(layer, 1, sequence.slot, token, head, dim));
                    }
                }
            }
        }
        for (rt::PageCopy const& pair : forkPairs)
        {
            for (int64_t kv = 0; kv < 2; ++kv)
            {
                std::memcpy(&expected[kv * halfElems + pair.dst * pageElems],
                    &expected[kv * halfElems + pair.src * pageElems],
                    static_cast<size_t>(pageElems) * sizeof(uint16_t));
            }
        }
        for (int32_t page : resetList)
        {
            for (int64_t kv = 0; kv < 2; ++kv)
            {
                for (int64_t i = 0; i < pageElems; ++i)
                {
                    // Little-endian pattern: even half-words take the low 16 bits, odd ones the high 16 bits.
                    expected[kv * halfElems + page * pageElems + i] =
                        static_cast<uint16_t>(i % 2 == 0 ? kRESET_PATTERN & 0xFFFFu : kRESET_PATTERN >> 16);
                }
            }
        }

        int64_t mismatches = 0;
        for (size_t i = 0; i < expected.size(); ++i)
        {
            if (actual[layer][i] == expected[i])
            {
                continue;
            }
            if (mismatches == 0)
            {
                int64_t const index = static_cast<int64_t>(i);
                int64_t const inPage = index % halfElems % pageElems;
                std::fprintf(stderr,
                    "layer %d: first mismatch at kv %lld, page %lld, token %lld, head %lld, dim %lld: "
                    "got 0x%04x, expected 0x%04x\n",
                    layer, static_cast<long long>(index / halfElems),
                    static_cast<long long>(index % halfElems / pageElems),
                    static_cast<long long>(inPage / (numKVHeads * headDim)),
                    static_cast<long long>(inPage / headDim % numKVHeads), static_cast<long long>(inPage % headDim),
                    actual[layer][i], expected[i]);
            }
            ++mismatches;
        }
        std::printf("layer %d: %s checked, %lld elements differ\n", layer,
            formatBytes(layout.layers[layer].layerBytes).c_str(), static_cast<long long>(mismatches));
        totalMismatches += mismatches;
    }

    // Also the direct statement of the fork: the target slot's pages equal the source slot's, byte for byte.
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        int64_t const pageElems = layout.layers[layer].pageElems;
        int64_t const halfElems = layout.layers[layer].halfElems;
        for (rt::PageCopy const& pair : forkPairs)
        {
            for (int64_t kv = 0; kv < 2; ++kv)
            {
                if (std::memcmp(&actual[layer][kv * halfElems + pair.src * pageElems],
                        &actual[layer][kv * halfElems + pair.dst * pageElems],
                        static_cast<size_t>(pageElems) * sizeof(uint16_t))
                    != 0)
                {
                    std::fprintf(stderr, "layer %d: forked page %d differs from its source page %d\n", layer, pair.dst,
                        pair.src);
                    ++totalMismatches;
                }
            }
        }
    }

    std::printf("%s\n", totalMismatches == 0 ? "PASS" : "FAIL");
    return totalMismatches == 0 ? 0 : 1;
}

} // namespace

int main()
{
    std::string const reason = gpuUnavailableReason();
    if (!reason.empty())
    {
        bool const required = gpuRequired();
        std::fprintf(stderr, "kvcache-quickstart needs a CUDA GPU: %s; %s\n", reason.c_str(),
            required ? "failing because KVCACHE_REQUIRE_GPU=1" : "skipping (exit 77)");
        return required ? 1 : kEXIT_SKIPPED;
    }
    try
    {
        return runQuickstart();
    }
    catch (std::exception const& error)
    {
        std::fprintf(stderr, "kvcache-quickstart failed: %s\n", error.what());
        return 1;
    }
}
