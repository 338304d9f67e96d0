// Host tests of the msgpack encoding of KV event batches (kvcache/events/kv_event_publisher.h): every event kind in
// both encodings against bytes written out here by hand from the msgpack specification and vLLM's field order.

#include "kvcache/events/kv_event_publisher.h"
#include "kvcache/paging/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt
{
namespace
{

using Bytes = std::vector<uint8_t>;

//! A msgpack fixstr (shorter than 32 bytes): 0xa0 | length, then the characters.
Bytes str(std::string const& text)
{
    Bytes bytes(text.size() + 1);
    bytes[0] = static_cast<uint8_t>(0xa0 | text.size());
    std::copy(text.begin(), text.end(), bytes.begin() + 1);
    return bytes;
}

Bytes operator+(Bytes const& a, Bytes const& b)
{
    Bytes sum(a.size() + b.size());
    std::copy(a.begin(), a.end(), sum.begin());
    std::copy(b.begin(), b.end(), sum.begin() + static_cast<std::ptrdiff_t>(a.size()));
    return sum;
}

// A hash of lo 0x0102030405060708 and hi 0x1112131415161718: bin 8 of 16 bytes, lo then hi, little-endian.
PageHash const kHASH{0x0102030405060708ULL, 0x1112131415161718ULL};
Bytes const kHASH_BYTES{
    0xc4, 0x10, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11};
// The parent: lo 1, hi 0.
PageHash const kPARENT{1, 0};
Bytes const kPARENT_BYTES{0xc4, 0x10, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
// ts 1.5 as float64: 0xcb and the IEEE 754 bits 0x3ff8000000000000, big-endian.
Bytes const kTS{0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0};

Bytes encode(KVEventBatch const& batch, KVEventEncoding encoding, std::optional<int32_t> rank)
{
    Bytes out;
    encodeKVEventBatch(batch, 1.5, encoding, rank, out);
    return out;
}

TEST(KVEventEncoding, AllBlocksCleared)
{
    KVEventBatch batch;
    batch.addAllCleared();
    // {"ts": 1.5, "events": [{"type": "AllBlocksCleared"}]}: no rank, so no data_parallel_rank key.
    Bytes const map = Bytes{0x82} + str("ts") + kTS + str("events") + Bytes{0x91, 0x81} + str("type") + Bytes{0xb0}
        + Bytes{'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd'};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_MAP, std::nullopt), map);
    // [1.5, [["AllBlocksCleared"]], 2]
    Bytes const array = Bytes{0x93} + kTS + Bytes{0x91, 0x91} + Bytes{0xb0}
        + Bytes{'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd'} + Bytes{0x02};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_ARRAY, 2), array);
    // The map form with a rank: a third key; the array form without one: nil.
    Bytes const withRank =
        Bytes{0x83} + Bytes(map.begin() + 1, map.end()) + str("data_parallel_rank") + Bytes{0xcd, 0x01, 0x2c};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_MAP, 300), withRank);
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_ARRAY, std::nullopt),
        Bytes(array.begin(), array.end() - 1) + Bytes{0xc0});
}

TEST(KVEventEncoding, BlockRemoved)
{
    KVEventBatch batch;
    batch.addRemoved(1, KVEventMedium::kCPU, kHASH);
    batch.addRemoved(1, KVEventMedium::kCPU, kPARENT);
    ASSERT_EQ(batch.events().size(), 1u);
    Bytes const hashes = Bytes{0x92} + kHASH_BYTES + kPARENT_BYTES;
    Bytes const map = Bytes{0x82} + str("ts") + kTS + str("events") + Bytes{0x91, 0x84} + str("type")
        + str("BlockRemoved") + str("block_hashes") + hashes + str("medium") + str("CPU") + str("group_idx")
        + Bytes{0x01};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_MAP, std::nullopt), map);
    Bytes const array =
        Bytes{0x93} + kTS + Bytes{0x91, 0x94} + str("BlockRemoved") + hashes + str("CPU") + Bytes{0x01} + Bytes{0xc0};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_ARRAY, std::nullopt), array);
}

TEST(KVEventEncoding, BlockStoredWithParentTokensAndExtraKeys)
{
    KVEventBatch batch;
    batch.beginStored(0, KVEventMedium::kGPU, 2, &kPARENT);
    int32_t const tokens[2] = {5, 300};
    // The salt "z", then one key's 20 bytes 0, 1, ..., 19.
    Bytes keys{'z'};
    for (uint8_t b = 0; b < 20; ++b)
    {
        keys.push_back(b);
    }
    batch.addStoredPage(kHASH, tokens, keys.data(), 1, 1);
    Bytes const keyBin = Bytes{0xc4, 0x14} + Bytes(keys.begin() + 1, keys.end());
    // extra_keys: one page, [salt, key].
    Bytes const extraKeys = Bytes{0x91, 0x92, 0xc4, 0x01, 'z'} + keyBin;
    // token_ids: 5 is a positive fixint, 300 a uint16 (0xcd).
    Bytes const tokenIds{0x92, 0x05, 0xcd, 0x01, 0x2c};
    Bytes const map = Bytes{0x82} + str("ts") + kTS + str("events") + Bytes{0x91, 0x8a} + str("type")
        + str("BlockStored") + str("block_hashes") + Bytes{0x91} + kHASH_BYTES + str("parent_block_hash")
        + kPARENT_BYTES + str("token_ids") + tokenIds + str("block_size") + Bytes{0x02} + str("lora_id") + Bytes{0xc0}
        + str("medium") + str("GPU") + str("lora_name") + Bytes{0xc0} + str("extra_keys") + extraKeys + str("group_idx")
        + Bytes{0x00};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_MAP, std::nullopt), map);
    Bytes const array = Bytes{0x93} + kTS + Bytes{0x91, 0x9a} + str("BlockStored") + Bytes{0x91} + kHASH_BYTES
        + kPARENT_BYTES + tokenIds + Bytes{0x02, 0xc0} + str("GPU") + Bytes{0xc0} + extraKeys + Bytes{0x00}
        + Bytes{0xc0};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_ARRAY, std::nullopt), array);
}

TEST(KVEventEncoding, BlockStoredWithoutParentTokensOrKeys)
{
    // A host page: no parent, no token ids, no keys; group 3 on the disk.
    KVEventBatch batch;
    batch.beginStored(3, KVEventMedium::kDISK, 16, nullptr);
    batch.addStoredPage(kHASH, nullptr, nullptr, 0, 0);
    // No extra_keys key in the map form (its default), nil in its place in the array form.
    Bytes const map = Bytes{0x82} + str("ts") + kTS + str("events") + Bytes{0x91, 0x89} + str("type")
        + str("BlockStored") + str("block_hashes") + Bytes{0x91} + kHASH_BYTES + str("parent_block_hash") + Bytes{0xc0}
        + str("token_ids") + Bytes{0x90} + str("block_size") + Bytes{0x10} + str("lora_id") + Bytes{0xc0}
        + str("medium") + str("DISK") + str("lora_name") + Bytes{0xc0} + str("group_idx") + Bytes{0x03};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_MAP, std::nullopt), map);
    Bytes const array = Bytes{0x93} + kTS + Bytes{0x91, 0x9a} + str("BlockStored") + Bytes{0x91} + kHASH_BYTES
        + Bytes{0xc0, 0x90, 0x10, 0xc0} + str("DISK") + Bytes{0xc0, 0xc0, 0x03} + Bytes{0xc0};
    EXPECT_EQ(encode(batch, KVEventEncoding::kTAGGED_ARRAY, std::nullopt), array);
}

TEST(KVEventEncoding, TimestampsAreAlwaysFloat64)
{
    // 0.0 and 2.0 hold integers; vLLM's ts is a float all the same: 0xcb and the bits, big-endian.
    KVEventBatch batch;
    batch.addAllCleared();
    Bytes zero;
    encodeKVEventBatch(batch, 0.0, KVEventEncoding::kTAGGED_ARRAY, std::nullopt, zero);
    EXPECT_EQ(Bytes(zero.begin(), zero.begin() + 10), (Bytes{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}));
    Bytes two;
    encodeKVEventBatch(batch, 2.0, KVEventEncoding::kTAGGED_ARRAY, std::nullopt, two);
    EXPECT_EQ(Bytes(two.begin(), two.begin() + 10), (Bytes{0x93, 0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(KVEventEncoding, EncodingNamesAndAppending)
{
    EXPECT_STREQ(toString(KVEventEncoding::kTAGGED_MAP), "tagged-map");
    EXPECT_STREQ(toString(KVEventEncoding::kTAGGED_ARRAY), "tagged-array");
    EXPECT_STREQ(toString(static_cast<KVEventEncoding>(7)), "unknown");
    // The payload is appended to what `out` holds.
    KVEventBatch batch;
    batch.addAllCleared();
    Bytes out{0xff};
    encodeKVEventBatch(batch, 1.5, KVEventEncoding::kTAGGED_ARRAY, std::nullopt, out);
    EXPECT_EQ(out, Bytes{0xff} + encode(batch, KVEventEncoding::kTAGGED_ARRAY, std::nullopt));
}

} // namespace
} // namespace kvcache::rt
