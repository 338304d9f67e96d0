// Links kvcache::transfer from the package and checks a host-only part of it: the geometry fingerprint two peers
// compare before a transfer equals FNV-1a over the encoding its header documents, computed here from the config, and
// changes with the page size and with the quantization.
#include <kvcache/dist/page_transfer.h>
#include <kvcache/kvcache.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace
{

uint64_t fnv1a(std::vector<int32_t> const& values)
{
    uint64_t hash = 14695981039346656037ULL;
    for (int32_t const value : values)
    {
        auto const bits = static_cast<uint32_t>(value);
        for (int shift = 0; shift < 32; shift += 8)
        {
            hash ^= (bits >> shift) & 0xFFu;
            hash *= 1099511628211ULL;
        }
    }
    return hash;
}

} // namespace

int main()
{
    namespace rt = kvcache::rt;
    rt::KVCacheManager::Config config;
    config.numAttentionLayers = 2;
    config.maxBatchSize = 1;
    config.maxSequenceLength = 64;
    config.layerConfigs = {{2, 64}, {4, 32}};
    config.kvCacheType = rt::DataType::kHALF;
    config.tokensPerPage = 16;
    rt::KVCacheLayout const layout = rt::KVCacheManager::validate(config);

    // Version 2, 2 layers, kHALF (1) of 2 bytes, 16 tokens a page, 1 group, quantization kNONE (0); per layer kind
    // kKV (0), heads, dim, window 0, group 0.
    uint64_t const expected = fnv1a({2, 2, 1, 2, 16, 1, 0, 0, 2, 64, 0, 0, 0, 4, 32, 0, 0});
    uint64_t const got = rt::geometryFingerprint(layout);
    if (got != expected)
    {
        std::fprintf(stderr, "geometryFingerprint is %llx, expected %llx\n", static_cast<unsigned long long>(got),
            static_cast<unsigned long long>(expected));
        return 1;
    }
    config.tokensPerPage = 32;
    if (rt::geometryFingerprint(rt::KVCacheManager::validate(config)) == got)
    {
        std::fprintf(stderr, "another page size gave the same fingerprint\n");
        return 1;
    }
    // FP8 values with and without per-tensor scales: the same bytes a page, read back differently.
    config.tokensPerPage = 16;
    config.kvCacheType = rt::DataType::kFP8_E4M3;
    uint64_t const plain = rt::geometryFingerprint(rt::KVCacheManager::validate(config));
    config.quantization = rt::KVQuantization::kFP8_PER_TENSOR;
    if (rt::geometryFingerprint(rt::KVCacheManager::validate(config)) == plain)
    {
        std::fprintf(stderr, "another quantization gave the same fingerprint\n");
        return 1;
    }
    std::printf("kvcache::transfer ok\n");
    return 0;
}
