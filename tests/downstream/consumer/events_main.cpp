// Links kvcache::events from the package and checks a host-only part of it: an AllBlocksCleared batch in the
// positional form is the msgpack bytes written out here ([ts, [["AllBlocksCleared"]], nil]).
#include <kvcache/events/kv_event_publisher.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main()
{
    kvcache::rt::KVEventBatch batch;
    batch.addAllCleared();
    std::vector<uint8_t> out;
    kvcache::rt::encodeKVEventBatch(batch, 0.0, kvcache::rt::KVEventEncoding::kTAGGED_ARRAY, std::nullopt, out);
    std::vector<uint8_t> expected{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xb0};
    char const name[] = "AllBlocksCleared";
    expected.insert(expected.end(), name, name + std::strlen(name));
    expected.push_back(0xc0);
    if (out != expected)
    {
        std::printf("the encoded batch differs from the expected bytes\n");
        return 1;
    }
    std::printf("kvcache::events ok\n");
    return 0;
}
