// kvcache quickstart: the KV cache of a small model whose attention layers differ in shape. Write a sequence with a
// kernel, fork it into another batch slot, reset the pages of the original, read values back.
// tests/scenarios/test_usage_scenario.cu checks the same steps byte for byte.
//
// Run: kvcache-quickstart   (exits 77 without a GPU, or 1 when KVCACHE_REQUIRE_GPU=1 is set)

#include <kvcache/kvcache.h>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <vector>

namespace
{

namespace rt = kvcache::rt;

//! The pages of one sequence in token order, small enough to travel to a kernel by value.
struct PageTable
{
    int32_t pages[8];
};

//! Writes K = t + 1 and V = -(t + 1) into every value of token t of a sequence: one block a token.
__global__ void writeSequence(rt::LayerRef layer, PageTable table)
{
    int32_t const token = static_cast<int32_t>(blockIdx.x);
    int32_t const page = table.pages[token / layer.tokensPerPage];
    int32_t const position = token % layer.tokensPerPage;
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < layer.numKVHeads * layer.headDim;
         i += static_cast<int32_t>(blockDim.x))
    {
        int32_t const head = i / layer.headDim;
        layer.k<__half>(page, position, head)[i % layer.headDim] = __float2half_rn(static_cast<float>(token + 1));
        layer.v<__half>(page, position, head)[i % layer.headDim] = __float2half_rn(static_cast<float>(-(token + 1)));
    }
}

//! Prints K and V of (page, position, head 0, dim 0) of every layer; returns whether they are `k` and -`k`.
bool showValues(rt::KVCacheManager const& cache, char const* what, int32_t page, int32_t position, float k)
{
    bool ok = true;
    std::printf("%-18s page %d position %d:", what, page, position);
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        rt::LayerRef const ref = cache.layerRef(layer); // its addresses work on the host too
        __half kv[2];
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(
            &kv[0], ref.kAddress(page, position, 0), sizeof(__half), cudaMemcpyDeviceToHost, cache.stream()));
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(
            &kv[1], ref.vAddress(page, position, 0), sizeof(__half), cudaMemcpyDeviceToHost, cache.stream()));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(cache.stream()));
        ok = ok && __half2float(kv[0]) == k && __half2float(kv[1]) == -k;
        std::printf("  layer %d K %4.0f V %4.0f", layer, __half2float(kv[0]), __half2float(kv[1]));
    }
    std::printf("%s\n", ok ? "" : "  WRONG");
    return ok;
}

//! Returns true when every value read back is what the steps wrote.
bool runQuickstart(cudaStream_t stream)
{
    rt::KVCacheManager::Config config;
    config.numAttentionLayers = 3;
    config.maxBatchSize = 4;
    config.maxSequenceLength = 300;                     // rounded up to whole pages: 5 pages a slot
    config.layerConfigs = {{8, 64}, {4, 128}, {2, 96}}; // (numKVHeads, headDim): each layer sized for its own shape
    config.kvCacheType = rt::DataType::kHALF;
    config.tokensPerPage = 64;
    // validate() does the layout maths without a GPU. Pages beyond the minimum ("retained") serve prefix caching.
    config.numPages = rt::KVCacheManager::validate(config).minPages + 4;
    rt::KVCacheManager cache(config, stream);
    std::printf("%d layers, %d pages (%d retained), %lld bytes\n", cache.numLayers(), cache.numPages(),
        cache.numPages() - cache.minPages(), static_cast<long long>(cache.layout().cacheBytes));
    try // with retained pages the slot view's V half would start inside the K pool
    {
        static_cast<void>(cache.getCombinedKVCache(0));
    }
    catch (rt::InvalidConfigError const& error)
    {
        std::printf("refused, as documented: %s\n", error.what());
    }

    // A 100-token sequence on the first two pages of batch slot 0, forked onto the first two of slot 1.
    int32_t const length = 100;
    int32_t const slot1 = cache.layout().pagesPerSlot;
    PageTable const table{{0, 1}};
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        writeSequence<<<length, 128, 0, stream>>>(cache.layerRef(layer), table); // the ref travels by value
        KVCACHE_CUDA_TRY(cudaGetLastError());
    }
    rt::copyPages(cache, {{0, slot1}, {1, slot1 + 1}}, stream);    // every layer, K and V, in one launch
    int32_t const position = (length - 1) % cache.tokensPerPage(); // of the last token, on each sequence's page 1
    float const last = static_cast<float>(length);                 // its K
    bool ok = showValues(cache, "written", 1, position, last);
    ok = showValues(cache, "forked", slot1 + 1, position, last) && ok;

    // The original finished: clear its pages so that nothing stale is read when they are handed out again.
    rt::resetPages(cache, {0, 1}, stream);
    ok = showValues(cache, "original, reset", 1, position, 0.0F) && ok;
    ok = showValues(cache, "fork, after reset", slot1 + 1, position, last) && ok;
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok;
}

} // namespace

int main()
{
    int devices = 0;
    if (cudaError_t const status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0)
    {
        char const* require = std::getenv("KVCACHE_REQUIRE_GPU");
        bool const fail = require != nullptr && std::string_view(require) == "1";
        std::fprintf(stderr, "kvcache-quickstart needs a CUDA GPU: %s; %s\n",
            devices == 0 && status == cudaSuccess ? "no CUDA device is visible" : cudaGetErrorName(status),
            fail ? "failing because KVCACHE_REQUIRE_GPU=1" : "skipping (exit 77)");
        return fail ? 1 : 77; // ctest reports 77 as skipped
    }
    cudaStream_t stream = nullptr;
    int exitStatus = 1;
    try
    {
        KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        exitStatus = runQuickstart(stream) ? 0 : 1; // the cache is gone before the stream it freed its memory on
    }
    catch (rt::Error const& error) // a bad config or argument, a CUDA error, out of memory
    {
        std::fprintf(stderr, "kvcache error: %s\n", error.what());
    }
    catch (std::exception const& error) // also rt::OutOfRangeError, a std::out_of_range
    {
        std::fprintf(stderr, "kvcache-quickstart failed: %s\n", error.what());
    }
    if (stream != nullptr && cudaStreamDestroy(stream) != cudaSuccess)
    {
        exitStatus = 1;
    }
    return exitStatus;
}
