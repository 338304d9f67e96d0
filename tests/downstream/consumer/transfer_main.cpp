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

    // The one group's page: kHALF (1), quantization kNONE (0), 16 tokens, no window, 2 layers (kind kKV (0), heads,
    // dim), then its bytes as a uint64: 2 halves * 16 tokens * (2 * 64 + 4 * 32) values * 2 bytes = 16384.
    uint64_t const page = fnv1a({1, 0, 16, 0, 2, 0, 2, 64, 0, 4, 32, 16384, 0});
    // Version 3, 1 group, then the group's page fingerprint as a uint64, low word first.
    uint64_t const expected = fnv1a({3, 1, static_cast<uint32_t>(page), static_cast<uint32_t>(page >> 32)});
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
