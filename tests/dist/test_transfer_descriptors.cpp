// Host tests of transfer descriptors (no GPU): each cache's pools are simulated as host bytes at made-up addresses,
// the remote ones filled with bytes that differ per position and per remote, the local ones poisoned; the ranges are
// applied as a transfer library would copy them, and every byte of every moved token is checked against where the
// documented layout ([pages, tokensPerPage, heads, bytes] per half, data parts then scale parts) puts it on each side.
// Cases: same geometry, page size remaps both ways, tensor parallelism 2 -> 1 and 1 -> 2, replicated heads, latent
// layers, quantized pages with scale parts, windowed groups; the description's bytes; every refusal by name.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/dist/tensor_parallel.h"
#include "kvcache/dist/transfer_descriptors.h"
#include "kvcache/paging/page_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::smallCacheOf;
using test::throwsNaming;

KVLayerConfig kvLayer(int32_t heads, int32_t dim, int32_t window = 0)
{
    return KVLayerConfig{heads, dim, window, KVLayerKind::kKV};
}

//! One part of a group's page as the test lays it out, from the docs' rules, not from the library's anatomy.
struct Part
{
    int32_t layer = 0;     //!< the layout's layer index
    int32_t halves = 2;    //!< 1 for a latent layer
    int64_t unit = 0;      //!< bytes of one token of one head in one half
    int32_t heads = 0;     //!< heads the cache holds
    int32_t firstHead = 0; //!< the model head its head 0 is
    uint64_t base = 0;     //!< the K pool's address
};

//! One cache: its config and layout, its simulated memory and its parts per group.
struct Side
{
    KVCacheConfig config;
    KVCacheLayout layout;
    TransferDescription description;
    uint64_t address = 0;
    std::vector<uint8_t> memory;
    std::vector<std::vector<Part>> parts; //!< per group
    int32_t tokensPerPage(int32_t group) const
    {
        (void)group;
        return layout.tokensPerPage;
    }
    int32_t numPages(int32_t group) const
    {
        return layout.groups[static_cast<size_t>(group)].numPages;
    }
};

int64_t dataUnit(KVCacheConfig const& config, KVLayerConfig const& layer)
{
    if (config.quantization == KVQuantization::kNVFP4)
    {
        return layer.headDim / 2;
    }
    return int64_t{layer.headDim} * dataTypeSize(config.kvCacheType);
}

int64_t scaleUnit(KVCacheConfig const& config, KVLayerConfig const& layer)
{
    return config.quantization == KVQuantization::kNVFP4 ? layer.headDim / 16 : 4;
}

//! Builds a side for `config` (already the rank's config under tensor parallelism) at `address`, its pools back to
//! back so that ranges of two pools would merge if nothing kept them apart; bytes filled from `seed` (0: poisoned).
Side makeSide(KVCacheConfig const& config, uint64_t address, int32_t device, uint32_t seed,
    TensorParallelShard const* shard = nullptr, std::vector<LayerScales> const& scales = {})
{
    Side side;
    side.config = config;
    side.layout = computeLayout(config);
    side.address = address;
    bool const scaled =
        config.quantization == KVQuantization::kFP8_PER_TOKEN_HEAD || config.quantization == KVQuantization::kNVFP4;
    std::vector<uint64_t> bases;
    uint64_t next = address;
    for (size_t g = 0; g < side.layout.groups.size(); ++g)
    {
        std::vector<Part> parts;
        for (int pass = 0; pass < (scaled ? 2 : 1); ++pass)
        {
            for (int32_t const layer : side.layout.groups[g].layers)
            {
                KVLayerConfig const& lc = config.layerConfigs[static_cast<size_t>(layer)];
                Part part;
                part.layer = layer;
                part.halves = lc.kind == KVLayerKind::kLATENT ? 1 : 2;
                part.unit = pass == 0 ? dataUnit(config, lc) : scaleUnit(config, lc);
                part.heads = lc.numKVHeads;
                part.firstHead = shard != nullptr ? shard->layers[static_cast<size_t>(layer)].firstHead : 0;
                part.base = next;
                next += static_cast<uint64_t>(part.halves * int64_t{side.layout.groups[g].numPages}
                    * config.tokensPerPage * part.heads * part.unit);
                bases.push_back(part.base);
                parts.push_back(part);
            }
        }
        side.parts.push_back(parts);
    }
    side.memory.resize(next - address);
    for (size_t i = 0; i < side.memory.size(); ++i)
    {
        side.memory[i] = seed == 0 ? uint8_t{0xEE} : static_cast<uint8_t>((i * 2654435761U + seed * 40503U) >> 11);
    }
    side.description = describeForTransfer(side.layout, bases, device, scales, shard);
    return side;
}

//! Copies every range pair from `remote` into `local`, as a transfer library would; fails on a range outside either.
void apply(TransferDescriptors const& ranges, Side const& remote, Side& local)
{
    ASSERT_EQ(ranges.local.size(), ranges.remote.size());
    for (size_t i = 0; i < ranges.local.size(); ++i)
    {
        MemoryRange const& to = ranges.local[i];
        MemoryRange const& from = ranges.remote[i];
        ASSERT_EQ(to.bytes, from.bytes) << "range " << i;
        ASSERT_GE(to.address, local.address);
        ASSERT_LE(to.address + to.bytes, local.address + local.memory.size()) << "range " << i;
        ASSERT_GE(from.address, remote.address);
        ASSERT_LE(from.address + from.bytes, remote.address + remote.memory.size()) << "range " << i;
        std::memcpy(local.memory.data() + (to.address - local.address),
            remote.memory.data() + (from.address - remote.address), to.bytes);
    }
}

//! The byte offset in `side`'s memory of byte `b` of token `t`, head `h` (the side's own head index), half `half` of
//! `part`, in page `page`.
uint64_t offsetOf(
    Side const& side, int32_t group, Part const& part, int32_t half, int32_t page, int64_t t, int64_t h, int64_t b)
{
    int64_t const p = side.tokensPerPage(group);
    int64_t const pageHalf = p * part.heads * part.unit;
    int64_t const offset =
        (int64_t{half} * side.numPages(group) + page) * pageHalf + ((t % p) * part.heads + h) * part.unit + b;
    return part.base - side.address + static_cast<uint64_t>(offset);
}

std::vector<TransferDescription> descriptionsOf(std::vector<Side> const& remotes)
{
    std::vector<TransferDescription> descriptions;
    for (Side const& remote : remotes)
    {
        descriptions.push_back(remote.description);
    }
    return descriptions;
}

//! Checks, after tokens [0, numTokens) of group `group` moved from `remotes` into a poisoned `local`, every byte of
//! every token a page on both sides holds, and that no other byte was written but a last run's tail.
void checkMoved(Side const& local, std::vector<Side> const& remotes, std::vector<int32_t> const& localPages,
    std::vector<int32_t> const& remotePages, int32_t group, int32_t numTokens)
{
    std::vector<uint8_t> touched(local.memory.size(), 0);
    auto const& localParts = local.parts[static_cast<size_t>(group)];
    for (size_t i = 0; i < localParts.size(); ++i)
    {
        Part const& part = localParts[i];
        for (int32_t half = 0; half < part.halves; ++half)
        {
            for (int64_t t = 0; t < numTokens; ++t)
            {
                int32_t const lp = localPages[static_cast<size_t>(t / local.tokensPerPage(group))];
                int32_t const rp = remotePages[static_cast<size_t>(t / remotes[0].tokensPerPage(group))];
                if (lp == kUNUSED_PAGE_ENTRY || rp == kUNUSED_PAGE_ENTRY)
                {
                    continue;
                }
                for (int64_t h = 0; h < part.heads; ++h)
                {
                    int64_t const modelHead = part.firstHead + h;
                    // The first remote holding the head is its source.
                    size_t r = 0;
                    Part const* from = nullptr;
                    for (; r < remotes.size(); ++r)
                    {
                        Part const& candidate = remotes[r].parts[static_cast<size_t>(group)][i];
                        if (modelHead >= candidate.firstHead && modelHead < candidate.firstHead + candidate.heads)
                        {
                            from = &candidate;
                            break;
                        }
                    }
                    if (from == nullptr)
                    {
                        ADD_FAILURE() << "no remote holds head " << modelHead;
                        return;
                    }
                    for (int64_t b = 0; b < part.unit; ++b)
                    {
                        uint64_t const at = offsetOf(local, group, part, half, lp, t, h, b);
                        uint8_t const expected = remotes[r].memory[offsetOf(
                            remotes[r], group, *from, half, rp, t, modelHead - from->firstHead, b)];
                        touched[at] = 1;
                        if (local.memory[at] != expected)
                        {
                            ADD_FAILURE()
                                << "part " << i << " half " << half << " token " << t << " head " << h << " byte " << b
                                << ": " << int{local.memory[at]} << ", expected " << int{expected};
                            return;
                        }
                    }
                }
            }
        }
    }
    // Bytes outside the moved tokens' pages stay poisoned (a run's tail past numTokens may be written).
    int64_t const run = std::min(local.tokensPerPage(group), remotes[0].tokensPerPage(group));
    int64_t const movedTokens = (numTokens + run - 1) / run * run;
    for (size_t i = 0; i < local.memory.size(); ++i)
    {
        if (touched[i] == 0 && local.memory[i] != 0xEE)
        {
            // Allow only the tail of the last run.
            bool inTail = false;
            for (Part const& part : localParts)
            {
                for (int32_t half = 0; half < part.halves && !inTail; ++half)
                {
                    for (int64_t t = numTokens; t < movedTokens && !inTail; ++t)
                    {
                        int32_t const lp = localPages[static_cast<size_t>(t / local.tokensPerPage(group))];
                        uint64_t const first = offsetOf(local, group, part, half, lp, t, 0, 0);
                        inTail = i >= first && i < first + static_cast<uint64_t>(part.heads * part.unit);
                    }
                }
            }
            if (!inTail)
            {
                ADD_FAILURE() << "byte " << i << " of the local memory was written; no moved token holds it";
                return;
            }
        }
    }
}

//! Moves tokens [0, numTokens) of group `group` from `remotes` into a poisoned `local` by transferDescriptors' ranges
//! and checks them (checkMoved); returns the ranges.
std::vector<TransferDescriptors> moveAndCheck(Side& local, std::vector<Side> const& remotes,
    std::vector<int32_t> const& localPages, std::vector<int32_t> const& remotePages, int32_t group, int32_t numTokens)
{
    std::vector<TransferDescriptors> const ranges =
        transferDescriptors(local.description, localPages.data(), static_cast<int32_t>(localPages.size()),
            descriptionsOf(remotes), remotePages.data(), static_cast<int32_t>(remotePages.size()), group, numTokens);
    EXPECT_EQ(ranges.size(), remotes.size());
    for (size_t r = 0; r < ranges.size(); ++r)
    {
        apply(ranges[r], remotes[r], local);
    }
    checkMoved(local, remotes, localPages, remotePages, group, numTokens);
    return ranges;
}

//! Descriptor `index` of the prepared list `prepared` as a range: descriptors run block after block, `count` each.
MemoryRange descriptorAt(PreparedDescriptors const& prepared, int64_t index)
{
    for (DescriptorBlock const& block : prepared.blocks)
    {
        if (index < block.count)
        {
            return {block.address + static_cast<uint64_t>(index) * block.bytes, block.bytes, block.device};
        }
        index -= block.count;
    }
    ADD_FAILURE() << "descriptor index past the list's end";
    return {};
}

//! Moves tokens [0, numTokens) of group `group` as a transfer through prepared lists would: both sides' lists from
//! preparedDescriptors at the plan's granularity, and for each run of that many tokens, each layer and each block of
//! the layer, descriptor page * descriptorsPerPage + (run % descriptorsPerPage) of that block on each side (the rule
//! the header states). Then checks as checkMoved does; returns the plan.
PreparedPlan movePreparedAndCheck(Side& local, std::vector<Side> const& remotes, std::vector<int32_t> const& localPages,
    std::vector<int32_t> const& remotePages, int32_t group, int32_t numTokens)
{
    PreparedPlan const plan = preparedPlan(local.description, descriptionsOf(remotes), group);
    int32_t const g = plan.tokensPerDescriptor;
    PreparedDescriptors const mine = preparedDescriptors(local.description, group, g);
    std::vector<PreparedDescriptors> theirs;
    for (Side const& remote : remotes)
    {
        theirs.push_back(preparedDescriptors(remote.description, group, g));
    }
    std::vector<TransferDescriptors> moves(remotes.size());
    for (size_t l = 0; l < plan.layerSources.size(); ++l)
    {
        int32_t const r = plan.layerSources[l];
        if (r < 0)
        {
            ADD_FAILURE() << "layer " << l << " has no whole source";
            return plan;
        }
        PreparedDescriptors const& other = theirs[static_cast<size_t>(r)];
        int64_t const first = l == 0 ? 0 : mine.layerEnds[l - 1];
        int64_t const otherFirst = l == 0 ? 0 : other.layerEnds[l - 1];
        EXPECT_EQ(mine.layerEnds[l] - first, other.layerEnds[l] - otherFirst) << "layer " << l;
        for (int64_t c = 0; c * g < numTokens; ++c)
        {
            int32_t const lp = localPages[static_cast<size_t>(c / mine.descriptorsPerPage)];
            int32_t const rp = remotePages[static_cast<size_t>(c / other.descriptorsPerPage)];
            if (lp == kUNUSED_PAGE_ENTRY || rp == kUNUSED_PAGE_ENTRY)
            {
                continue;
            }
            for (int64_t k = 0; k < mine.layerEnds[l] - first; ++k)
            {
                auto const start = [k](PreparedDescriptors const& p, int64_t firstBlock)
                {
                    int64_t index = 0;
                    for (int64_t b = 0; b < firstBlock + k; ++b)
                    {
                        index += p.blocks[static_cast<size_t>(b)].count;
                    }
                    return index;
                };
                int64_t const li =
                    start(mine, first) + int64_t{lp} * mine.descriptorsPerPage + c % mine.descriptorsPerPage;
                int64_t const ri =
                    start(other, otherFirst) + int64_t{rp} * other.descriptorsPerPage + c % other.descriptorsPerPage;
                moves[static_cast<size_t>(r)].local.push_back(descriptorAt(mine, li));
                moves[static_cast<size_t>(r)].remote.push_back(descriptorAt(other, ri));
            }
        }
    }
    for (size_t r = 0; r < remotes.size(); ++r)
    {
        apply(moves[r], remotes[r], local);
    }
    checkMoved(local, remotes, localPages, remotePages, group, numTokens);
    return plan;
}

constexpr uint64_t kLOCAL = 0x7000'0000'0000;
constexpr uint64_t kREMOTE = 0x5000'0000'0000;
constexpr uint64_t kREMOTE2 = 0x5800'0000'0000;

//! Layers of 4, 2 and 1 KV heads (the last replicated at tp 2), and the model's shards at tp 2 and tp 1.
struct ShardedModel
{
    KVCacheConfig model = smallCacheOf({kvLayer(4, 8), kvLayer(2, 16), kvLayer(1, 8)});
    TensorParallelShard rank0 = tensorParallelShard(model, 2, 0);
    TensorParallelShard rank1 = tensorParallelShard(model, 2, 1);
    TensorParallelShard whole = tensorParallelShard(model, 1, 0);
};

//! A move from one remote cache into a local one, which both ways of moving pages are checked on.
struct OneRemoteMove
{
    KVCacheConfig config;
    //! The remote's config where it differs from the local one's.
    std::optional<KVCacheConfig> remoteConfig;
    std::vector<LayerScales> scales;
    uint32_t remoteSeed = 0;
    std::vector<int32_t> localPages;
    std::vector<int32_t> remotePages;
    int32_t numTokens = 0;
    //! Moves the windowed group's pages rather than group 0's.
    bool windowed = false;
};

//! A latent layer beside a K/V layer, FP8 with a scale per token and head: part of a page moves.
OneRemoteMove latentFp8Move()
{
    OneRemoteMove move;
    move.config = ConfigBuilder({KVLayerConfig{1, 64, 0, KVLayerKind::kLATENT}, kvLayer(2, 32)})
                      .tokensPerPage(8)
                      .maxSequenceLength(32)
                      .maxBatchSize(2)
                      .dataType(DataType::kFP8_E4M3)
                      .quantization(KVQuantization::kFP8_PER_TOKEN_HEAD);
    move.remoteSeed = 19;
    move.localPages = {1, 0, 7};
    move.remotePages = {2, 3, 4};
    move.numTokens = 17;
    return move;
}

//! NVFP4 pages with their scale parts, and per-layer scales in the descriptions.
OneRemoteMove nvfp4Move()
{
    OneRemoteMove move;
    move.config =
        smallCacheOf({kvLayer(2, 32), kvLayer(4, 16)}).dataType(DataType::kUINT8).quantization(KVQuantization::kNVFP4);
    move.scales = {{0.5F, 0.25F}, {2.0F, 4.0F}};
    move.remoteSeed = 23;
    move.localPages = {2, 5};
    move.remotePages = {0, 1};
    move.numTokens = 32;
    return move;
}

//! A windowed group whose released pages are unused entries on both sides: only the window's pages move. The full
//! group's layer has other heads and another head size, so that ranges worked out from its geometry, pools or page
//! counts move other bytes than the windowed group's.
OneRemoteMove windowedMove()
{
    OneRemoteMove move;
    move.config = ConfigBuilder({kvLayer(2, 8, 32), kvLayer(4, 16)})
                      .tokensPerPage(16)
                      .maxSequenceLength(128)
                      .maxBatchSize(2)
                      .maxTokensPerStep(16);
    move.remoteSeed = 29;
    move.localPages = {kUNUSED_PAGE_ENTRY, kUNUSED_PAGE_ENTRY, 3, 1};
    move.remotePages = {kUNUSED_PAGE_ENTRY, 4, 0, 2};
    move.numTokens = 60;
    move.windowed = true;
    return move;
}

//! Two layers of 2 x 16 and 1 x 32, `tokensPerPage` tokens a page.
KVCacheConfig remapConfig(int32_t tokensPerPage)
{
    return ConfigBuilder({kvLayer(2, 16), kvLayer(1, 32)})
        .tokensPerPage(tokensPerPage)
        .maxSequenceLength(256)
        .maxBatchSize(2);
}

//! 150 tokens between pages of 64 tokens and pages of 16: 3 pages on one side, 10 on the other.
OneRemoteMove remapMove(int32_t localTokensPerPage, int32_t remoteTokensPerPage)
{
    std::vector<int32_t> const large{5, 1, 2};
    std::vector<int32_t> const small{30, 7, 8, 9, 10, 0, 1, 2, 3, 11};
    bool const largeLocal = localTokensPerPage > remoteTokensPerPage;
    OneRemoteMove move;
    move.config = remapConfig(localTokensPerPage);
    move.remoteConfig = remapConfig(remoteTokensPerPage);
    move.remoteSeed = largeLocal ? 3 : 5;
    move.localPages = largeLocal ? large : small;
    move.remotePages = largeLocal ? small : large;
    move.numTokens = 150;
    return move;
}

//! Builds both sides of `move` (the local one poisoned) and moves its pages with `mover` (moveAndCheck or
//! movePreparedAndCheck, which check every moved byte); returns what `mover` returns.
template <typename Mover>
auto moveOneRemote(OneRemoteMove const& move, Mover mover)
{
    Side local = makeSide(move.config, kLOCAL, 0, 0, nullptr, move.scales);
    std::vector<Side> const remotes{
        makeSide(move.remoteConfig.value_or(move.config), kREMOTE, 0, move.remoteSeed, nullptr, move.scales)};
    int32_t group = 0;
    for (size_t g = 0; g < local.layout.groups.size(); ++g)
    {
        group = move.windowed && local.layout.groups[g].slidingWindow > 0 ? static_cast<int32_t>(g) : group;
    }
    return mover(local, remotes, move.localPages, move.remotePages, group, move.numTokens);
}

TEST(TransferDescriptors, SameGeometryMergesAdjacentPagesAndKeepsLayersApart)
{
    KVCacheConfig const config =
        ConfigBuilder({kvLayer(2, 8), kvLayer(2, 8)}).tokensPerPage(16).maxSequenceLength(64).maxBatchSize(4);
    Side local = makeSide(config, kLOCAL, 0, 0);
    std::vector<Side> const remotes{makeSide(config, kREMOTE, 1, 7)};
    // Local pages 3, 4, 5 are adjacent; remote 9, 10 are, then 2.
    auto const ranges = moveAndCheck(local, remotes, {3, 4, 5}, {9, 10, 2}, 0, 40);
    ASSERT_EQ(ranges.size(), 1U);
    // Per layer and half: pages 0-1 merged (both sides adjacent), page 2 alone. Half bytes 16 * 2 * 8 * 2 = 512.
    ASSERT_EQ(ranges[0].local.size(), 8U);
    EXPECT_EQ(ranges[0].layerEnds, (std::vector<int64_t>{4, 8}));
    EXPECT_EQ(ranges[0].local[0].address, kLOCAL + 3 * 512);
    EXPECT_EQ(ranges[0].local[0].bytes, 1024U);
    EXPECT_EQ(ranges[0].remote[0].address, kREMOTE + 9 * 512);
    EXPECT_EQ(ranges[0].local[0].device, 0);
    EXPECT_EQ(ranges[0].remote[0].device, 1);
    EXPECT_EQ(ranges[0].local[1].address, kLOCAL + 5 * 512);
    EXPECT_EQ(ranges[0].remote[1].address, kREMOTE + 2 * 512);
    // The V half starts numPages (16) pages after K.
    EXPECT_EQ(ranges[0].local[2].address, kLOCAL + (16 + 3) * 512);
}

TEST(TransferDescriptors, RangesNeverCrossFromOnePoolIntoTheNext)
{
    KVCacheConfig const config =
        ConfigBuilder({kvLayer(2, 8), kvLayer(2, 8)}).tokensPerPage(16).maxSequenceLength(64).maxBatchSize(4);
    Side local = makeSide(config, kLOCAL, 0, 0);
    std::vector<Side> const remotes{makeSide(config, kREMOTE, 0, 31)};
    // The last page of layer 0's V pool ends where page 0 of layer 1's K pool starts, on both sides.
    int32_t const last = local.numPages(0) - 1;
    auto const ranges = moveAndCheck(local, remotes, {0, last}, {0, last}, 0, 32);
    std::vector<MemoryRange> const pools = registrationRanges(local.description);
    for (MemoryRange const& range : ranges[0].local)
    {
        int inside = 0;
        for (MemoryRange const& pool : pools)
        {
            inside += range.address >= pool.address && range.address + range.bytes <= pool.address + pool.bytes ? 1 : 0;
        }
        EXPECT_EQ(inside, 1) << range.address << " + " << range.bytes;
    }
    // Per layer: K page 0, then K's last page merged with V page 0 (the V pool follows the K pool), then V's last page.
    EXPECT_EQ(ranges[0].layerEnds, (std::vector<int64_t>{3, 6}));
}

TEST(TransferDescriptors, PageSizesThatDifferByAWholeFactorRemapBothWays)
{
    moveOneRemote(remapMove(64, 16), moveAndCheck);
    auto const ranges = moveOneRemote(remapMove(16, 64), moveAndCheck);
    EXPECT_EQ(ranges[0].layerEnds.size(), 2U);
}

TEST(TransferDescriptors, TensorParallelTwoToOneAndOneToTwo)
{
    ShardedModel const tp;
    {
        // Decode at tp 1 pulls from both prefill ranks; the replicated one-head layer comes from the first listed.
        Side local = makeSide(tp.model, kLOCAL, 0, 0, &tp.whole);
        std::vector<Side> const remotes{makeSide(tp.rank1.config, kREMOTE2, 1, 11, &tp.rank1),
            makeSide(tp.rank0.config, kREMOTE, 0, 13, &tp.rank0)};
        auto const ranges = moveAndCheck(local, remotes, {2, 3}, {6, 1}, 0, 20);
        // The one-head layer (index 2) is replicated: rank 1, listed first, sends it and rank 0 sends none of it.
        EXPECT_EQ(ranges[1].layerEnds[2], ranges[1].layerEnds[1]);
        EXPECT_GT(ranges[0].layerEnds[2], ranges[0].layerEnds[1]);
    }
    {
        // Decode rank 1 of tp 2 takes its heads from a tp-1 prefill: one range per token and layer half.
        Side local = makeSide(tp.rank1.config, kLOCAL, 0, 0, &tp.rank1);
        std::vector<Side> const remotes{makeSide(tp.model, kREMOTE, 0, 17, &tp.whole)};
        auto const ranges = moveAndCheck(local, remotes, {0, 1}, {4, 5}, 0, 32);
        // Layer 0 (2 of 4 heads): 32 tokens x 2 halves; no two tokens' slices touch on the remote side.
        EXPECT_EQ(ranges[0].layerEnds[0], 64);
    }
}

TEST(TransferDescriptors, LatentLayersAndQuantizedPagesMoveEveryPart)
{
    moveOneRemote(latentFp8Move(), moveAndCheck);
    moveOneRemote(nvfp4Move(), moveAndCheck);
}

TEST(TransferDescriptors, WindowedGroupSkipsReleasedPages)
{
    moveOneRemote(windowedMove(), moveAndCheck);
}

TEST(TransferDescriptors, DescriptionBytesRoundTripAndBadBytesAreRefused)
{
    KVCacheConfig const model = smallCacheOf({kvLayer(4, 8), kvLayer(2, 16, 32)})
                                    .dataType(DataType::kFP8_E4M3)
                                    .quantization(KVQuantization::kFP8_PER_TENSOR);
    TensorParallelShard const rank1 = tensorParallelShard(model, 2, 1);
    Side const side = makeSide(rank1.config, kREMOTE, 3, 1, &rank1, {{0.5F, 0.75F}, {1.5F, -0.0F}});
    std::vector<uint8_t> const bytes = encodeTransferDescription(side.description);
    ASSERT_GE(bytes.size(), 8U);
    EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "KVTD");
    EXPECT_EQ(bytes[4], 2);
    TransferDescription const back = decodeTransferDescription(bytes.data(), bytes.size());
    EXPECT_EQ(back.device, 3);
    EXPECT_EQ(back.tp, 2);
    EXPECT_EQ(back.rank, 1);
    ASSERT_EQ(back.groups.size(), side.description.groups.size());
    for (size_t g = 0; g < back.groups.size(); ++g)
    {
        EXPECT_EQ(back.groups[g].geometry, side.description.groups[g].geometry);
        EXPECT_EQ(back.groups[g].numPages, side.description.groups[g].numPages);
        EXPECT_EQ(back.groups[g].poolBases, side.description.groups[g].poolBases);
        for (size_t l = 0; l < back.groups[g].layers.size(); ++l)
        {
            EXPECT_EQ(back.groups[g].layers[l].firstHead, side.description.groups[g].layers[l].firstHead);
            EXPECT_EQ(back.groups[g].layers[l].replicas, side.description.groups[g].layers[l].replicas);
            EXPECT_EQ(std::memcmp(&back.groups[g].layers[l].hostScales,
                          &side.description.groups[g].layers[l].hostScales, sizeof(LayerScales)),
                0);
        }
    }
    EXPECT_EQ(encodeTransferDescription(back), bytes);
    // Every early end is refused, as are trailing bytes, another magic and another version.
    for (size_t size = 0; size < bytes.size(); ++size)
    {
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { (void)decodeTransferDescription(bytes.data(), size); }, {"decodeTransferDescription", "end"}))
            << size;
    }
    std::vector<uint8_t> longer = bytes;
    longer.push_back(0);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)decodeTransferDescription(longer.data(), longer.size()); }, {"1 bytes follow"}));
    std::vector<uint8_t> magic = bytes;
    magic[0] = 'X';
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)decodeTransferDescription(magic.data(), magic.size()); }, {"magic", "KVTD"}));
    std::vector<uint8_t> version = bytes;
    version[4] = 3;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)decodeTransferDescription(version.data(), version.size()); }, {"version is 3", "versions 1 and 2"}));
}

TEST(TransferDescriptors, RegistrationCoversEveryPoolOnce)
{
    KVCacheConfig const config = smallCacheOf({kvLayer(2, 32), KVLayerConfig{1, 64, 0, KVLayerKind::kLATENT}})
                                     .dataType(DataType::kFP8_E4M3)
                                     .quantization(KVQuantization::kFP8_PER_TOKEN_HEAD);
    Side const side = makeSide(config, kLOCAL, 2, 1);
    std::vector<MemoryRange> const ranges = registrationRanges(side.description);
    ASSERT_EQ(ranges.size(), 4U); // two layers' data, then their scales
    uint64_t next = kLOCAL;
    for (MemoryRange const& range : ranges)
    {
        EXPECT_EQ(range.address, next);
        EXPECT_EQ(range.device, 2);
        next += range.bytes;
    }
    EXPECT_EQ(next, kLOCAL + side.memory.size());
}

TEST(TransferDescriptors, MismatchesAreRefusedByName)
{
    auto const builder = [] { return smallCacheOf({kvLayer(2, 8), kvLayer(2, 8)}); };
    Side const local = makeSide(builder(), kLOCAL, 0, 0);
    std::vector<int32_t> const pages{0, 1};
    auto const refused = [&](std::vector<TransferDescription> const& remotes, std::vector<std::string> const& words,
                             int32_t numTokens = 32, std::vector<int32_t> const& localPages = {0, 1})
    {
        return throwsNaming<InvalidArgumentError>(
            [&]
            {
                (void)transferDescriptors(local.description, localPages.data(), static_cast<int32_t>(localPages.size()),
                    remotes, pages.data(), static_cast<int32_t>(pages.size()), 0, numTokens);
            },
            words);
    };
    EXPECT_TRUE(refused({}, {"remotes is empty"}));
    EXPECT_TRUE(refused({makeSide(builder().dataType(DataType::kBF16), kREMOTE, 0, 1).description},
        {"remotes[0]", "dataType", "the local cache", "the remote cache"}));
    TransferDescription odd = makeSide(builder(), kREMOTE, 0, 1).description;
    odd.groups[0].geometry.tokensPerPage = 24;
    EXPECT_TRUE(
        refused({odd}, {"tokensPerPage is 16 in the local cache and 24 in the remote cache", "whole multiple"}));
    EXPECT_TRUE(refused({makeSide(smallCacheOf({kvLayer(4, 8), kvLayer(2, 8)}), kREMOTE, 0, 1).description},
        {"layers[0].numKVHeads is 2 in the local cache and 4 in the remote cache", "model heads"}));
    EXPECT_TRUE(refused({makeSide(builder(), kREMOTE, 0, 1).description}, {"numTokens is -1"}, -1));
    EXPECT_TRUE(refused({makeSide(builder(), kREMOTE, 0, 1).description}, {"localPages holds 1 pages", "need 2"}, 32,
        std::vector<int32_t>{0}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&]
        {
            std::vector<int32_t> const bad{0, 99};
            std::vector<TransferDescription> const remotes{makeSide(builder(), kREMOTE, 0, 1).description};
            (void)transferDescriptors(local.description, bad.data(), 2, remotes, pages.data(), 2, 0, 32);
        },
        {"localPages[1] is page 99"}));
    EXPECT_NE(transferMismatch(local.description, local.description, 5).find("group 5 is outside"), std::string::npos);
    // Host-held scales must agree bit for bit.
    KVCacheConfig const fp8 = builder().dataType(DataType::kFP8_E4M3).quantization(KVQuantization::kFP8_PER_TENSOR);
    Side const a = makeSide(fp8, kLOCAL, 0, 0, nullptr, {{1.0F, 1.0F}, {0.5F, 0.5F}});
    Side const b = makeSide(fp8, kREMOTE, 0, 1, nullptr, {{1.0F, 1.0F}, {0.5F, 0.25F}});
    EXPECT_NE(transferMismatch(a.description, b.description, 0).find("layer 1's host-held scales"), std::string::npos)
        << transferMismatch(a.description, b.description, 0);
    EXPECT_EQ(transferMismatch(a.description, a.description, 0), "");
    // A local head no remote holds.
    KVCacheConfig const model = builder();
    TensorParallelShard const rank0 = tensorParallelShard(model, 2, 0);
    Side const half = makeSide(rank0.config, kREMOTE, 0, 1, &rank0);
    EXPECT_TRUE(refused({half.description}, {"no remote holds model head 1"}));
}

TEST(PreparedDescriptors, OneDescriptorPerPageHalfInTheRangesOrder)
{
    KVCacheConfig const config =
        ConfigBuilder({kvLayer(2, 8), kvLayer(1, 16)}).tokensPerPage(16).maxSequenceLength(64).maxBatchSize(4);
    Side const side = makeSide(config, kLOCAL, 3, 0);
    PreparedDescriptors const whole = preparedDescriptors(side.description, 0, 16);
    // Per layer K then V; a page half is 16 tokens x 2 heads x 8 x 2 bytes = 512 in layer 0, 16 x 1 x 16 x 2 in 1.
    int64_t const pages = side.numPages(0);
    ASSERT_EQ(whole.blocks.size(), 4U);
    EXPECT_EQ(whole.layerEnds, (std::vector<int64_t>{2, 4}));
    EXPECT_EQ(whole.numPages, pages);
    EXPECT_EQ(whole.descriptorsPerPage, 1);
    EXPECT_EQ(whole.blocks[0].address, kLOCAL);
    EXPECT_EQ(whole.blocks[0].bytes, 512U);
    EXPECT_EQ(whole.blocks[0].count, pages);
    EXPECT_EQ(whole.blocks[0].device, 3);
    EXPECT_EQ(whole.blocks[1].address, kLOCAL + static_cast<uint64_t>(pages * 512));
    EXPECT_EQ(whole.blocks[2].address, kLOCAL + static_cast<uint64_t>(2 * pages * 512));
    EXPECT_EQ(whole.blocks[3].address, kLOCAL + static_cast<uint64_t>(2 * pages * 512 + pages * 512));
    // Four descriptors per page at 4 tokens each: the same bytes, a quarter as long each.
    PreparedDescriptors const fine = preparedDescriptors(side.description, 0, 4);
    EXPECT_EQ(fine.descriptorsPerPage, 4);
    EXPECT_EQ(fine.blocks[2].bytes, 128U);
    EXPECT_EQ(fine.blocks[2].count, 4 * pages);
    EXPECT_EQ(fine.blocks[2].address, whole.blocks[2].address);
    // Every block lies in one registered pool.
    for (DescriptorBlock const& block : fine.blocks)
    {
        int inside = 0;
        for (MemoryRange const& pool : registrationRanges(side.description))
        {
            uint64_t const end = block.address + block.bytes * static_cast<uint64_t>(block.count);
            inside += block.address >= pool.address && end <= pool.address + pool.bytes ? 1 : 0;
        }
        EXPECT_EQ(inside, 1);
    }
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)preparedDescriptors(side.description, 0, 6); }, {"tokensPerDescriptor is 6", "tokensPerPage 16"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)preparedDescriptors(side.description, 0, 0); }, {"tokensPerDescriptor is 0"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { (void)preparedDescriptors(side.description, 2, 16); }, {"group 2", "1 groups"}));
}

TEST(PreparedDescriptors, PagesMoveThroughPreparedListsWithPageSizesRemapped)
{
    {
        Side local = makeSide(remapConfig(16), kLOCAL, 0, 0);
        std::vector<Side> const remotes{makeSide(remapConfig(16), kREMOTE, 0, 2)};
        PreparedPlan const plan = movePreparedAndCheck(local, remotes, {3, 4, 5}, {9, 10, 2}, 0, 40);
        EXPECT_EQ(plan.tokensPerDescriptor, 16);
        EXPECT_EQ(plan.layerSources, (std::vector<int32_t>{0, 0}));
    }
    EXPECT_EQ(moveOneRemote(remapMove(64, 16), movePreparedAndCheck).tokensPerDescriptor, 16);
    moveOneRemote(remapMove(16, 64), movePreparedAndCheck);
}

TEST(PreparedDescriptors, LatentQuantizedAndWindowedPagesMoveThroughPreparedLists)
{
    moveOneRemote(latentFp8Move(), movePreparedAndCheck);
    // The latent layer: data K, scales K; the other: data K, V, scales K, V.
    Side const latent = makeSide(latentFp8Move().config, kLOCAL, 0, 0);
    EXPECT_EQ(preparedDescriptors(latent.description, 0, 8).layerEnds, (std::vector<int64_t>{2, 6}));
    moveOneRemote(nvfp4Move(), movePreparedAndCheck);
    moveOneRemote(windowedMove(), movePreparedAndCheck);
}

TEST(PreparedDescriptors, PlanTakesWholeLayersOnlyWhereTheHeadsMatch)
{
    ShardedModel const tp;
    Side const prefill0 = makeSide(tp.rank0.config, kREMOTE, 0, 13, &tp.rank0);
    Side const prefill1 = makeSide(tp.rank1.config, kREMOTE2, 1, 11, &tp.rank1);
    // tp 2 -> 1: the split layers come in slices; the replicated one-head layer whole from the first listed.
    Side const decodeWhole = makeSide(tp.model, kLOCAL, 0, 0, &tp.whole);
    EXPECT_EQ(preparedPlan(decodeWhole.description, {prefill1.description, prefill0.description}, 0).layerSources,
        (std::vector<int32_t>{-1, -1, 0}));
    // tp 1 -> 2: rank 1 holds a slice of the prefill's heads, but all of the replicated layer.
    Side const decode1 = makeSide(tp.rank1.config, kLOCAL, 0, 0, &tp.rank1);
    EXPECT_EQ(
        preparedPlan(decode1.description, {makeSide(tp.model, kREMOTE, 0, 17, &tp.whole).description}, 0).layerSources,
        (std::vector<int32_t>{-1, -1, 0}));
    // tp 2 -> 2, rank for rank: every layer whole, from the rank holding the same heads.
    {
        Side local = makeSide(tp.rank1.config, kLOCAL, 0, 0, &tp.rank1);
        std::vector<Side> const remotes{prefill0, prefill1};
        PreparedPlan const plan = movePreparedAndCheck(local, remotes, {0, 1}, {4, 5}, 0, 32);
        EXPECT_EQ(plan.layerSources, (std::vector<int32_t>{1, 1, 0}));
    }
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)preparedPlan(decodeWhole.description, {}, 0); }, {"preparedPlan", "remotes is empty"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&]
        { (void)preparedPlan(decodeWhole.description, {prefill0.description}, 0); },
        {"preparedPlan", "no remote holds model head 2"}));
}

} // namespace
} // namespace kvcache::rt
