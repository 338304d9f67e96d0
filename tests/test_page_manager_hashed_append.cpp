// Host tests of the library's internal append that takes the hashes hashNextPages() computed
// (src/paging/page_manager_internal.h, the tiered prefix cache's onboarding): the pages it fills are registered under
// exactly the hashes a plain append() gives them, extra keys and pieces shorter than a page included, and an append
// that cannot continue the given hashes is refused before anything changes.

#include "paging/page_manager_internal.h"

#include "kvcache/errors.h"
#include "kvcache/page_hash.h"
#include "kvcache/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"

namespace kvcache::rt::detail
{
namespace
{

using test::throwsNaming;
using test::tokensFrom;

constexpr int32_t kP = 4;

//! One group of 32 pages of 4 tokens, sequences of up to 40 tokens, 3 tokens a step (pieces shorter than a page).
KVCacheConfig shortSteps()
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(2)
        .maxSequenceLength(40)
        .tokensPerPage(kP)
        .maxTokensPerStep(3)
        .numPages(32);
}

//! The extra keys of `keys` in [begin, end).
std::vector<PageExtraKey> keysIn(std::vector<PageExtraKey> const& keys, int32_t begin, int32_t end)
{
    std::vector<PageExtraKey> slice;
    std::copy_if(keys.begin(), keys.end(), std::back_inserter(slice),
        [&](PageExtraKey const& key) { return key.position >= begin && key.position < end; });
    return slice;
}

//! An eviction callback's call.
struct Evicted
{
    int32_t page;
    PageHash hash;
    bool operator==(Evicted const& other) const
    {
        return page == other.page && hash == other.hash;
    }
};

//! A manager whose evictions are recorded.
struct Recorded
{
    Recorded()
        : manager(shortSteps(), test::seededOptions(4, 3))
    {
        manager.setEvictionCallback([this](int32_t, int32_t page, PageHash hash) { evicted.push_back({page, hash}); });
    }
    //! Frees `sequence` and evicts every cached page; returns the evictions (last page first, as free() releases).
    std::vector<Evicted> freeAndEvict(SequenceId sequence)
    {
        manager.free(sequence);
        evicted.clear();
        manager.evictCached(0, manager.counts(0).cached);
        return evicted;
    }
    PageManager manager;
    std::vector<Evicted> evicted;
};

TEST(PageManagerHashedAppend, RegistersTheHashesAPlainAppendRegisters)
{
    // 6 pages and 2 tokens; keys in page 1 (two, one at a piece boundary) and page 4. The hashes cover pages [0, 5):
    // the appends take them for pages 0-4 and hash page 5 themselves; the last piece is a plain append.
    std::vector<int32_t> const prompt = tokensFrom(100, 6 * kP + 2);
    std::vector<PageExtraKey> const keys = {{5, PageHash{1, 2}}, {6, PageHash{3, 4}}, {17, PageHash{5, 6}}};
    Recorded plain;
    Recorded hashed;
    SequenceId const a = plain.manager.create();
    SequenceId const b = hashed.manager.create();
    std::vector<PageHash> hashes(5);
    std::vector<PageExtraKey> const runKeys = keysIn(keys, 0, 5 * kP);
    NextPageHashes const known = PageManagerInternal::hashNextPages(
        hashed.manager, b, prompt.data(), 5 * kP, hashes.data(), runKeys.data(), static_cast<int32_t>(runKeys.size()));
    EXPECT_EQ(known.sequence, b);
    EXPECT_EQ(known.firstPage, 0);
    EXPECT_EQ(known.count, 5);
    EXPECT_EQ(known.hashes, hashes.data());
    EXPECT_EQ(known.parent, hashed.manager.hasher().root(nullptr, 0));
    int32_t hashedAppends = 0;
    for (int32_t at = 0; at < static_cast<int32_t>(prompt.size()); at += 3)
    {
        int32_t const count = std::min<int32_t>(3, static_cast<int32_t>(prompt.size()) - at);
        std::vector<PageExtraKey> const pieceKeys = keysIn(keys, at, at + count);
        SequenceAppend const pa{a, prompt.data() + at, count, pieceKeys.data(), static_cast<int32_t>(pieceKeys.size())};
        SequenceAppend const pb{b, prompt.data() + at, count, pieceKeys.data(), static_cast<int32_t>(pieceKeys.size())};
        plain.manager.append(pa);
        if (at / kP <= known.firstPage + known.count)
        {
            PageManagerInternal::appendHashed(hashed.manager, pb, known);
            ++hashedAppends;
        }
        else
        {
            hashed.manager.append(pb);
        }
    }
    EXPECT_EQ(hashedAppends, 8); // [0, 24): pages 0-4 from the hashes, page 5 hashed by the append
    EXPECT_EQ(hashed.manager.length(b), 6 * kP + 2);

    // A new sequence of the same prompt adopts the hashed sequence's 6 whole pages, with the keys and not without.
    SequenceId const probe = hashed.manager.create();
    EXPECT_EQ(hashed.manager.adoptPrefix(probe, prompt.data(), static_cast<int32_t>(prompt.size()), keys.data(),
                  static_cast<int32_t>(keys.size())),
        6 * kP);
    SequencePages const adopted = hashed.manager.pages(probe, 0);
    SequencePages const held = hashed.manager.pages(b, 0);
    EXPECT_TRUE(std::equal(adopted.pages, adopted.pages + 6, held.pages));
    hashed.manager.free(probe);
    SequenceId const keyless = hashed.manager.create();
    EXPECT_EQ(hashed.manager.adoptPrefix(keyless, prompt.data(), static_cast<int32_t>(prompt.size())), kP);
    hashed.manager.free(keyless);

    // Both managers took the same pages and registered them under the same hashes: the eviction callback reports the
    // same (page, hash) calls, and the hashes are hashNextPages()'s.
    std::vector<Evicted> const fromPlain = plain.freeAndEvict(a);
    std::vector<Evicted> const fromHashed = hashed.freeAndEvict(b);
    ASSERT_EQ(fromPlain.size(), 6u);
    EXPECT_EQ(fromHashed, fromPlain);
    for (int32_t p = 0; p < 5; ++p)
    {
        EXPECT_EQ(fromHashed[static_cast<size_t>(5 - p)].hash, hashes[static_cast<size_t>(p)]) << "page " << p;
    }
    EXPECT_NO_THROW(plain.manager.checkInvariants());
    EXPECT_NO_THROW(hashed.manager.checkInvariants());
}

TEST(PageManagerHashedAppend, RefusesHashesTheSequenceDoesNotContinueAndChangesNothing)
{
    Recorded hashed;
    PageManager& manager = hashed.manager;
    std::vector<int32_t> const prompt = tokensFrom(7, 3 * kP);
    SequenceId const a = manager.create();
    SequenceId const b = manager.create();
    std::vector<PageHash> hashes(3);
    NextPageHashes const known =
        PageManagerInternal::hashNextPages(manager, a, prompt.data(), 3 * kP, hashes.data(), nullptr, 0);
    auto const unchanged = [&]
    {
        EXPECT_EQ(manager.length(a), 0);
        EXPECT_EQ(manager.length(b), 0);
        EXPECT_EQ(manager.counts(0).used, 0);
        EXPECT_NO_THROW(manager.checkInvariants());
    };

    // Another sequence's hashes.
    SequenceAppend const toB{b, prompt.data(), 3, nullptr, 0};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { PageManagerInternal::appendHashed(manager, toB, known); }, {"appendHashed", "sequence", "[0, 3)"}));
    unchanged();

    // A sequence whose chain is not the hashes' one: b holds another first page.
    std::vector<PageHash> otherHashes(3);
    NextPageHashes const ofB =
        PageManagerInternal::hashNextPages(manager, b, prompt.data(), 3 * kP, otherHashes.data(), nullptr, 0);
    std::vector<int32_t> const other = tokensFrom(900, kP);
    manager.append({b, other.data(), 3, nullptr, 0});
    manager.append({b, other.data() + 3, 1, nullptr, 0});
    SequenceAppend const next{b, prompt.data() + kP, 3, nullptr, 0};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { PageManagerInternal::appendHashed(manager, next, ofB); }, {"appendHashed", "4 tokens", "hash chain"}));
    EXPECT_EQ(manager.length(b), kP);

    // A sequence past the hashed pages: a holds 4 pages, the hashes are of pages [0, 3).
    std::vector<int32_t> const longer = tokensFrom(7, 4 * kP + 1);
    for (int32_t at = 0; at < 4 * kP; at += 2)
    {
        manager.append({a, longer.data() + at, 2, nullptr, 0});
    }
    SequenceAppend const late{a, longer.data() + 4 * kP, 1, nullptr, 0};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { PageManagerInternal::appendHashed(manager, late, known); }, {"16 tokens", "between 0 and 3"}));
    EXPECT_EQ(manager.length(a), 4 * kP);
    EXPECT_NO_THROW(manager.checkInvariants());
}

TEST(PageManagerHashedAppend, DebugBuildsRefuseHashesTheTokensDoNotMake)
{
#ifdef NDEBUG
    GTEST_SKIP() << "appendHashed checks the hashes against the tokens only in debug builds (its precondition)";
#else
    Recorded hashed;
    std::vector<int32_t> const prompt = tokensFrom(7, 2 * kP);
    std::vector<int32_t> const other = tokensFrom(70, 2 * kP);
    SequenceId const a = hashed.manager.create();
    std::vector<PageHash> hashes(2);
    NextPageHashes const known =
        PageManagerInternal::hashNextPages(hashed.manager, a, prompt.data(), 2 * kP, hashes.data(), nullptr, 0);
    hashed.manager.append({a, other.data(), 3, nullptr, 0});
    SequenceAppend const fills{a, other.data() + 3, 3, nullptr, 0};
    EXPECT_TRUE(throwsNaming<std::logic_error>(
        [&] { PageManagerInternal::appendHashed(hashed.manager, fills, known); }, {"page 0", "hash"}));
#endif
}

} // namespace
} // namespace kvcache::rt::detail
