#include <kvcache/kvcache.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace
{

int gFailures = 0;

void expectEqual(char const* what, int64_t actual, int64_t expected)
{
    if (actual != expected)
    {
        std::fprintf(stderr, "%s is %lld, expected %lld\n", what, static_cast<long long>(actual),
            static_cast<long long>(expected));
        ++gFailures;
    }
}

} // namespace

int main()
{
    using kvcache::rt::KVCacheManager;

    KVCacheManager::Config config;
    config.numAttentionLayers = 2;
    config.maxBatchSize = 3;
    config.maxSequenceLength = 200;
    config.layerConfigs = {{8, 128}, {2, 64}};
    config.kvCacheType = kvcache::rt::DataType::kHALF;
    config.tokensPerPage = 64;
    config.numPages = 20;

    // Worked by hand: capPadded = ceil(200 / 64) * 64 = 256, so 4 pages per slot and 3 * 4 = 12 pages at least.
    // Layer 0: a page is 64 * 8 * 128 = 65536 elements (131072 bytes of float16), a half 20 pages = 1310720
    // elements, the layer 2 * 1310720 * 2 = 5242880 bytes. Layer 1: 64 * 2 * 64 = 8192 elements (16384 bytes),
    // a half 163840 elements, the layer 655360 bytes. One page id across both layers, K and V:
    // 2 * (131072 + 16384) = 294912 bytes; the cache 5242880 + 655360 = 5898240 = 20 * 294912 bytes.
    kvcache::rt::KVCacheLayout const layout = KVCacheManager::validate(config);
    expectEqual("capPadded", layout.capPadded, 256);
    expectEqual("pagesPerSlot", layout.pagesPerSlot, 4);
    expectEqual("minPages", layout.minPages, 12);
    expectEqual("numPages", layout.numPages, 20);
    expectEqual("layers", static_cast<int64_t>(layout.layers.size()), 2);
    if (layout.layers.size() == 2)
    {
        expectEqual("layers[0].pageElems", layout.layers[0].pageElems, 65536);
        expectEqual("layers[0].halfElems", layout.layers[0].halfElems, 1310720);
        expectEqual("layers[0].layerBytes", layout.layers[0].layerBytes, 5242880);
        expectEqual("layers[1].pageElems", layout.layers[1].pageElems, 8192);
        expectEqual("layers[1].halfElems", layout.layers[1].halfElems, 163840);
        expectEqual("layers[1].layerBytes", layout.layers[1].layerBytes, 655360);
    }
    expectEqual("bytesPerPage", layout.bytesPerPage, 294912);
    expectEqual("cacheBytes", layout.cacheBytes, 5898240);

    // LayerRef's address maths works in host code compiled without nvcc: element (page 3, token 5, head 1) of layer 0
    // is (3 * 64 + 5) * 8 * 128 + 1 * 128 = 201856 elements into either pool.
    kvcache::rt::LayerRef ref;
    ref.pageStride = 64 * 8 * 128;
    ref.tokenStride = 8 * 128;
    ref.headStride = 128;
    expectEqual("LayerRef::offset", ref.offset(3, 5, 1), 201856);

    // The library's exception types must reach the consumer as themselves.
    KVCacheManager::Config broken = config;
    broken.maxBatchSize = 0;
    try
    {
        KVCacheManager::validate(broken);
        std::fprintf(stderr, "validate accepted maxBatchSize = 0\n");
        ++gFailures;
    }
    catch (kvcache::rt::InvalidConfigError const& error)
    {
        std::printf("rejected as expected: %s\n", error.what());
    }

    if (std::strcmp(KVCACHE_VERSION_STRING, KVCACHE_PACKAGE_VERSION) != 0)
    {
        std::fprintf(
            stderr, "version.h says %s, the CMake package %s\n", KVCACHE_VERSION_STRING, KVCACHE_PACKAGE_VERSION);
        ++gFailures;
    }
    std::printf("kvcache %s\n", KVCACHE_VERSION_STRING);
    return gFailures == 0 ? 0 : 1;
}
