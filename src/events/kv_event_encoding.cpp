// KV event batches in msgpack, as vLLM's kv_events.py encodes them through msgspec (kvcache/events/kv_event_publisher.h
// gives both forms). msgpack-cxx's packer writes each value in its shortest form.
#include "kvcache/events/kv_event_publisher.h"

#include <cstdint>
#include <cstring>
#include <msgpack.hpp>

#include "events/kv_event_packed.h"

namespace kvcache::rt
{
namespace
{

//! msgpack-cxx's buffer interface over a byte vector that is appended to.
struct ByteWriter
{
    std::vector<uint8_t>* out;
    void write(char const* data, size_t size)
    {
        auto const* bytes = reinterpret_cast<uint8_t const*>(data);
        out->insert(out->end(), bytes, bytes + size);
    }
};

using Packer = msgpack::packer<ByteWriter>;

//! A float64 (0xcb, then the IEEE 754 bits big-endian), whatever its value: msgpack-cxx's pack_double writes a
//! double that holds an integer as an integer, and vLLM's ts is always a float.
void packFloat64(std::vector<uint8_t>& out, double value)
{
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    out.push_back(0xcb);
    for (int i = 7; i >= 0; --i)
    {
        out.push_back(static_cast<uint8_t>(bits >> (8 * i)));
    }
}

void packString(Packer& packer, char const* text)
{
    auto const size = static_cast<uint32_t>(std::strlen(text));
    packer.pack_str(size);
    packer.pack_str_body(text, size);
}

void packBytes(Packer& packer, uint8_t const* bytes, size_t size)
{
    packer.pack_bin(static_cast<uint32_t>(size));
    packer.pack_bin_body(reinterpret_cast<char const*>(bytes), static_cast<uint32_t>(size));
}

//! The 16 bytes of the digest: lo, then hi, little-endian.
void packHash(Packer& packer, PageHash hash)
{
    uint8_t bytes[16];
    for (int i = 0; i < 8; ++i)
    {
        bytes[i] = static_cast<uint8_t>(hash.lo >> (8 * i));
        bytes[8 + i] = static_cast<uint8_t>(hash.hi >> (8 * i));
    }
    packBytes(packer, bytes, sizeof(bytes));
}

void packHashes(Packer& packer, detail::KVEventArrays const& batch, KVEvent const& event)
{
    packer.pack_array(static_cast<uint32_t>(event.numHashes));
    for (int64_t h = event.firstHash; h < event.firstHash + event.numHashes; ++h)
    {
        packHash(packer, batch.hashes[static_cast<size_t>(h)]);
    }
}

//! Per page nil, or [salt (bin, when any), key bytes (bin, 20 each)...].
void packExtraKeys(Packer& packer, detail::KVEventArrays const& batch, KVEvent const& event)
{
    packer.pack_array(static_cast<uint32_t>(event.numHashes));
    for (int64_t h = event.firstHash; h < event.firstHash + event.numHashes; ++h)
    {
        KVEventPageKeys const& keys = batch.pageKeys[static_cast<size_t>(h)];
        if (keys.saltBytes == 0 && keys.numKeys == 0)
        {
            packer.pack_nil();
            continue;
        }
        packer.pack_array(static_cast<uint32_t>((keys.saltBytes > 0 ? 1 : 0) + keys.numKeys));
        uint8_t const* bytes = batch.keyBytes + keys.offset;
        if (keys.saltBytes > 0)
        {
            packBytes(packer, bytes, static_cast<size_t>(keys.saltBytes));
            bytes += keys.saltBytes;
        }
        for (int32_t k = 0; k < keys.numKeys; ++k, bytes += 20)
        {
            packBytes(packer, bytes, 20);
        }
    }
}

void packStored(Packer& packer, detail::KVEventArrays const& batch, KVEvent const& event, bool map)
{
    // Map: the tag, the seven fields without defaults, extra_keys when there are any, group_idx. Array: every field
    // up to group_idx, the last one set.
    if (map)
    {
        packer.pack_map(event.hasKeys ? 10 : 9);
        packString(packer, "type");
    }
    else
    {
        packer.pack_array(10);
    }
    packString(packer, "BlockStored");
    if (map)
    {
        packString(packer, "block_hashes");
    }
    packHashes(packer, batch, event);
    if (map)
    {
        packString(packer, "parent_block_hash");
    }
    if (event.hasParent)
    {
        packHash(packer, event.parent);
    }
    else
    {
        packer.pack_nil();
    }
    if (map)
    {
        packString(packer, "token_ids");
    }
    packer.pack_array(static_cast<uint32_t>(event.numTokens));
    for (int64_t t = event.firstToken; t < event.firstToken + event.numTokens; ++t)
    {
        packer.pack_int32(batch.tokens[static_cast<size_t>(t)]);
    }
    if (map)
    {
        packString(packer, "block_size");
    }
    packer.pack_int32(event.tokensPerPage);
    if (map)
    {
        packString(packer, "lora_id");
    }
    packer.pack_nil();
    if (map)
    {
        packString(packer, "medium");
    }
    packString(packer, toString(event.medium));
    if (map)
    {
        packString(packer, "lora_name");
    }
    packer.pack_nil();
    if (map && event.hasKeys)
    {
        packString(packer, "extra_keys");
    }
    if (event.hasKeys)
    {
        packExtraKeys(packer, batch, event);
    }
    else if (!map)
    {
        packer.pack_nil();
    }
    if (map)
    {
        packString(packer, "group_idx");
    }
    packer.pack_int32(event.group);
}

void packRemoved(Packer& packer, detail::KVEventArrays const& batch, KVEvent const& event, bool map)
{
    if (map)
    {
        packer.pack_map(4);
        packString(packer, "type");
    }
    else
    {
        packer.pack_array(4);
    }
    packString(packer, "BlockRemoved");
    if (map)
    {
        packString(packer, "block_hashes");
    }
    packHashes(packer, batch, event);
    if (map)
    {
        packString(packer, "medium");
    }
    packString(packer, toString(event.medium));
    if (map)
    {
        packString(packer, "group_idx");
    }
    packer.pack_int32(event.group);
}

} // namespace

char const* toString(KVEventEncoding encoding) noexcept
{
    switch (encoding)
    {
    case KVEventEncoding::kTAGGED_MAP: return "tagged-map";
    case KVEventEncoding::kTAGGED_ARRAY: return "tagged-array";
    }
    return "unknown";
}

void encodeKVEventBatch(KVEventBatch const& batch, double timestamp, KVEventEncoding encoding,
    std::optional<int32_t> dataParallelRank, std::vector<uint8_t>& out)
{
    detail::encodeKVEventArrays(detail::arraysOf(batch), timestamp, encoding, dataParallelRank, out);
}

void detail::encodeKVEventArrays(detail::KVEventArrays const& batch, double timestamp, KVEventEncoding encoding,
    std::optional<int32_t> dataParallelRank, std::vector<uint8_t>& out)
{
    ByteWriter writer{&out};
    Packer packer(writer);
    bool const map = encoding == KVEventEncoding::kTAGGED_MAP;
    if (map)
    {
        packer.pack_map(dataParallelRank ? 3 : 2);
        packString(packer, "ts");
    }
    else
    {
        packer.pack_array(3);
    }
    packFloat64(out, timestamp);
    if (map)
    {
        packString(packer, "events");
    }
    packer.pack_array(static_cast<uint32_t>(batch.numEvents));
    for (size_t e = 0; e < batch.numEvents; ++e)
    {
        KVEvent const& event = batch.events[e];
        switch (event.type)
        {
        case KVEventType::kSTORED: packStored(packer, batch, event, map); break;
        case KVEventType::kREMOVED: packRemoved(packer, batch, event, map); break;
        case KVEventType::kALL_CLEARED:
            if (map)
            {
                packer.pack_map(1);
                packString(packer, "type");
            }
            else
            {
                packer.pack_array(1);
            }
            packString(packer, "AllBlocksCleared");
            break;
        }
    }
    if (map && dataParallelRank)
    {
        packString(packer, "data_parallel_rank");
    }
    if (dataParallelRank)
    {
        packer.pack_int32(*dataParallelRank);
    }
    else if (!map)
    {
        packer.pack_nil();
    }
}

} // namespace kvcache::rt
