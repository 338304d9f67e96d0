// Chained page hashes (kvcache/paging/page_hash.h) against a model written from the header's documented byte strings
// and hashed here with libcrypto's EVP_Digest and xxhash.h, not with the library's code.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_hash.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include "support/error_matchers.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::test
{
namespace
{

namespace rt = kvcache::rt;
using rt::PageHash;
using rt::PageHashAlgorithm;
using rt::PageHasher;
using Seed = std::array<uint8_t, 32>;
using Bytes = std::vector<uint8_t>;

// The model: the documented byte strings, built byte by byte.

void appendLe(Bytes& bytes, uint64_t value, int width)
{
    for (int i = 0; i < width; ++i)
    {
        bytes.push_back(static_cast<uint8_t>(value >> (8 * i)));
    }
}

Bytes rootMessage(Seed const& seed, Bytes const& salt)
{
    Bytes bytes(16, 0);
    appendLe(bytes, 0, 4);
    bytes.insert(bytes.end(), seed.begin(), seed.end());
    appendLe(bytes, salt.size(), 8);
    bytes.insert(bytes.end(), salt.begin(), salt.end());
    return bytes;
}

Bytes pageMessage(PageHash parent, std::vector<int32_t> const& tokens, Bytes const& extra)
{
    Bytes bytes;
    appendLe(bytes, parent.lo, 8);
    appendLe(bytes, parent.hi, 8);
    appendLe(bytes, 1, 4);
    appendLe(bytes, tokens.size(), 4);
    appendLe(bytes, extra.size(), 8);
    for (int32_t const token : tokens)
    {
        appendLe(bytes, static_cast<uint32_t>(token), 4);
    }
    bytes.insert(bytes.end(), extra.begin(), extra.end());
    return bytes;
}

uint64_t loadLe(uint8_t const* bytes)
{
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i)
    {
        value |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    }
    return value;
}

PageHash modelHash(PageHashAlgorithm algorithm, Bytes const& message)
{
    if (algorithm == PageHashAlgorithm::kSHA256)
    {
        unsigned char digest[EVP_MAX_MD_SIZE];
        unsigned int digestBytes = 0;
        EXPECT_EQ(EVP_Digest(message.data(), message.size(), digest, &digestBytes, EVP_sha256(), nullptr), 1);
        EXPECT_EQ(digestBytes, 32u);
        return PageHash{loadLe(digest), loadLe(digest + 8)};
    }
    XXH128_hash_t const hash = XXH3_128bits(message.data(), message.size());
    return PageHash{hash.low64, hash.high64};
}

PageHash modelRoot(PageHashAlgorithm algorithm, Seed const& seed, Bytes const& salt)
{
    return modelHash(algorithm, rootMessage(seed, salt));
}

PageHash modelPage(PageHashAlgorithm algorithm, PageHash parent, std::vector<int32_t> const& tokens, Bytes const& extra)
{
    return modelHash(algorithm, pageMessage(parent, tokens, extra));
}

Seed testSeed(uint8_t first)
{
    Seed seed{};
    for (size_t i = 0; i < seed.size(); ++i)
    {
        seed[i] = static_cast<uint8_t>(first + 7 * i);
    }
    return seed;
}

//! Token ids that use all 32 bits: negative values and high bytes catch a wrong width or byte order.
std::vector<int32_t> randomTokens(size_t count, uint32_t seed)
{
    std::mt19937 generator(seed);
    std::vector<int32_t> tokens(count);
    for (int32_t& token : tokens)
    {
        token = static_cast<int32_t>(generator());
    }
    return tokens;
}

Bytes bytesOf(std::string const& text)
{
    return Bytes(text.begin(), text.end());
}

PageHash next(PageHasher const& hasher, PageHash parent, std::vector<int32_t> const& tokens, Bytes const& extra = {})
{
    return hasher.next(parent, tokens.empty() ? nullptr : tokens.data(), static_cast<int32_t>(tokens.size()),
        extra.empty() ? nullptr : extra.data(), extra.size());
}

class PageHashTest : public ::testing::TestWithParam<PageHashAlgorithm>
{
protected:
    PageHashAlgorithm algorithm() const
    {
        return GetParam();
    }
};

INSTANTIATE_TEST_SUITE_P(Algorithms, PageHashTest,
    ::testing::Values(PageHashAlgorithm::kSHA256, PageHashAlgorithm::kXXH3_128),
    [](::testing::TestParamInfo<PageHashAlgorithm> const& paramInfo)
    { return paramInfo.param == PageHashAlgorithm::kSHA256 ? std::string("sha256") : std::string("xxh3_128"); });

TEST_P(PageHashTest, RootIsTheDocumentedMessageHashed)
{
    Seed const seed = testSeed(3);
    PageHasher const hasher(algorithm(), seed);
    EXPECT_EQ(hasher.algorithm(), algorithm());
    EXPECT_EQ(hasher.seed(), seed);
    EXPECT_EQ(hasher.root(nullptr, 0), modelRoot(algorithm(), seed, {}));
    for (std::string const& salt :
        std::vector<std::string>{"t", "tenant-a", std::string(100, 'x'), std::string(3, '\0')})
    {
        EXPECT_EQ(hasher.root(salt.data(), salt.size()), modelRoot(algorithm(), seed, bytesOf(salt))) << salt.size();
    }
}

TEST_P(PageHashTest, NextIsTheDocumentedMessageHashed)
{
    PageHasher const hasher(algorithm(), testSeed(11));
    PageHash const parent = hasher.root(nullptr, 0);
    // Every count up to 600 crosses each SHA-256 padding case and the library's stack buffer / streaming boundary.
    for (size_t count = 0; count <= 600; ++count)
    {
        std::vector<int32_t> const tokens = randomTokens(count, static_cast<uint32_t>(count));
        ASSERT_EQ(next(hasher, parent, tokens), modelPage(algorithm(), parent, tokens, {})) << count;
    }
    for (size_t extraBytes : {1u, 8u, 33u, 64u, 1500u, 2100u, 5000u})
    {
        Bytes extra(extraBytes);
        for (size_t i = 0; i < extraBytes; ++i)
        {
            extra[i] = static_cast<uint8_t>(i * 31 + 5);
        }
        for (size_t count : {0u, 16u, 128u, 400u})
        {
            std::vector<int32_t> const tokens = randomTokens(count, 99);
            ASSERT_EQ(next(hasher, parent, tokens, extra), modelPage(algorithm(), parent, tokens, extra))
                << count << " tokens, " << extraBytes << " extra bytes";
        }
    }
}

TEST_P(PageHashTest, ChainEqualsNextInALoopAndTheModel)
{
    PageHasher const hasher(algorithm(), testSeed(21));
    PageHash const root = hasher.root("lora-7", 6);
    for (int32_t tokensPerPage : {0, 1, 6, 7, 13, 16, 31, 64, 128, 256, 502, 503, 520, 1024})
    {
        int32_t const numPages = 5;
        std::vector<int32_t> const tokens = randomTokens(static_cast<size_t>(numPages * tokensPerPage), 7);
        std::vector<PageHash> chained(numPages);
        hasher.chain(root, tokens.data(), numPages, tokensPerPage, chained.data());

        PageHash loopParent = root;
        PageHash modelParent = root;
        for (int32_t page = 0; page < numPages; ++page)
        {
            auto const first = tokens.begin() + page * tokensPerPage;
            std::vector<int32_t> const pageTokens(first, first + tokensPerPage);
            loopParent = next(hasher, loopParent, pageTokens);
            modelParent = modelPage(algorithm(), modelParent, pageTokens, {});
            ASSERT_EQ(chained[static_cast<size_t>(page)], loopParent) << tokensPerPage << " tokens, page " << page;
            ASSERT_EQ(chained[static_cast<size_t>(page)], modelParent) << tokensPerPage << " tokens, page " << page;
        }
        // A chain continues where another stopped: pages [0, 2) then [2, 5) give the same hashes.
        std::vector<PageHash> split(numPages);
        hasher.chain(root, tokens.data(), 2, tokensPerPage, split.data());
        hasher.chain(split[1], tokens.data() + 2 * tokensPerPage, numPages - 2, tokensPerPage, split.data() + 2);
        EXPECT_EQ(split, chained) << tokensPerPage;
    }
}

TEST_P(PageHashTest, SameSeedSameHashesInEveryHasher)
{
    Seed const seed = testSeed(42);
    PageHasher const first(algorithm(), seed);
    PageHasher const second(algorithm(), seed);
    std::vector<int32_t> const tokens = randomTokens(64, 1);
    std::vector<PageHash> a(4);
    std::vector<PageHash> b(4);
    first.chain(first.root("s", 1), tokens.data(), 4, 16, a.data());
    second.chain(second.root("s", 1), tokens.data(), 4, 16, b.data());
    EXPECT_EQ(a, b);

    PageHasher copy = first;
    PageHasher moved = std::move(copy);
    EXPECT_EQ(moved.seed(), seed);
    EXPECT_EQ(moved.algorithm(), algorithm());
    EXPECT_EQ(moved.root("s", 1), first.root("s", 1));
}

TEST_P(PageHashTest, RandomSeedsDiffer)
{
    PageHasher const first(algorithm());
    PageHasher const second(algorithm());
    EXPECT_EQ(first.algorithm(), algorithm());
    EXPECT_NE(first.seed(), second.seed());
    EXPECT_NE(first.seed(), Seed{});
    EXPECT_NE(first.root(nullptr, 0), second.root(nullptr, 0));
    // The random seed is the one the hashes use.
    EXPECT_EQ(first.root(nullptr, 0), modelRoot(algorithm(), first.seed(), {}));
}

TEST_P(PageHashTest, DifferentSaltsOrSeedsGiveDifferentRoots)
{
    PageHasher const hasher(algorithm(), testSeed(5));
    std::vector<Bytes> const salts = {
        {}, {0}, {0, 0}, {1}, bytesOf("tenant-a"), bytesOf("tenant-b"), bytesOf("tenant")};
    std::vector<PageHash> roots;
    for (Bytes const& salt : salts)
    {
        roots.push_back(hasher.root(salt.empty() ? nullptr : salt.data(), salt.size()));
    }
    for (size_t i = 0; i < roots.size(); ++i)
    {
        for (size_t j = i + 1; j < roots.size(); ++j)
        {
            EXPECT_NE(roots[i], roots[j]) << "salts " << i << " and " << j;
        }
    }
    EXPECT_NE(PageHasher(algorithm(), testSeed(6)).root(nullptr, 0), roots[0]);
    EXPECT_NE(PageHasher(
                  algorithm() == PageHashAlgorithm::kSHA256 ? PageHashAlgorithm::kXXH3_128 : PageHashAlgorithm::kSHA256,
                  testSeed(5))
                  .root(nullptr, 0),
        roots[0]);
}

TEST_P(PageHashTest, AnyChangeOfAPageChangesItsHash)
{
    PageHasher const hasher(algorithm(), testSeed(9));
    PageHash const root = hasher.root(nullptr, 0);
    std::vector<int32_t> const tokens = randomTokens(16, 3);
    PageHash const base = next(hasher, root, tokens);

    for (size_t i = 0; i < tokens.size(); ++i)
    {
        std::vector<int32_t> changed = tokens;
        changed[i] ^= 1 << (i % 31);
        EXPECT_NE(next(hasher, root, changed), base) << "token " << i;
    }
    std::vector<int32_t> shorter(tokens.begin(), tokens.end() - 1);
    EXPECT_NE(next(hasher, root, shorter), base);
    EXPECT_NE(next(hasher, hasher.root("x", 1), tokens), base);
    PageHash otherParent = root;
    otherParent.hi ^= 1;
    EXPECT_NE(next(hasher, otherParent, tokens), base);

    Bytes const extra = {1, 2, 3, 4};
    PageHash const withExtra = next(hasher, root, tokens, extra);
    EXPECT_NE(withExtra, base);
    EXPECT_NE(next(hasher, root, tokens, {1, 2, 3, 5}), withExtra);
    EXPECT_NE(next(hasher, root, tokens, {1, 2, 3}), withExtra);

    // The last token's bytes as extra bytes: the lengths keep the tokens / extra boundary apart.
    Bytes lastAsExtra(4);
    std::memcpy(lastAsExtra.data(), &tokens.back(), 4);
    EXPECT_NE(next(hasher, root, shorter, lastAsExtra), base);
}

TEST_P(PageHashTest, ATokenMovedBetweenPagesChangesTheChain)
{
    PageHasher const hasher(algorithm(), testSeed(13));
    PageHash const root = hasher.root(nullptr, 0);
    std::vector<int32_t> const tokens = randomTokens(8, 17);
    auto const chainOf = [&](size_t firstPageTokens)
    {
        std::vector<int32_t> const a(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(firstPageTokens));
        std::vector<int32_t> const b(tokens.begin() + static_cast<ptrdiff_t>(firstPageTokens), tokens.end());
        PageHash const first = next(hasher, root, a);
        return std::make_pair(first, next(hasher, first, b));
    };
    auto const even = chainOf(4);
    auto const moved = chainOf(3);
    EXPECT_NE(even.first, moved.first);
    EXPECT_NE(even.second, moved.second);
}

TEST_P(PageHashTest, BadArgumentsThrowAndWriteNothing)
{
    PageHasher const hasher(algorithm(), testSeed(1));
    PageHash const root = hasher.root(nullptr, 0);
    int32_t const tokens[4] = {1, 2, 3, 4};
    uint8_t const extra[2] = {1, 2};

    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { hasher.root(nullptr, 3); }, {"PageHasher::root", "salt is null", "saltBytes is 3", "must be 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { hasher.next(root, tokens, -1, nullptr, 0); }, {"PageHasher::next", "count is -1", ">= 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { hasher.next(root, nullptr, 2, nullptr, 0); },
        {"PageHasher::next", "tokens is null", "count is 2", "must be 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { hasher.next(root, tokens, 4, nullptr, 5); },
        {"PageHasher::next", "extra is null", "extraBytes is 5", "must be 0"}));
    // Null with nothing to read is fine.
    EXPECT_EQ(hasher.next(root, nullptr, 0, nullptr, 0), modelPage(algorithm(), root, {}, {}));
    EXPECT_EQ(hasher.next(root, tokens, 0, extra, 0), modelPage(algorithm(), root, {}, {}));

    PageHash poison{0x5555, 0xaaaa};
    std::vector<PageHash> out(2, poison);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { hasher.chain(root, tokens, -1, 2, out.data()); }, {"PageHasher::chain", "numPages is -1", ">= 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { hasher.chain(root, tokens, 2, -2, out.data()); }, {"PageHasher::chain", "tokensPerPage is -2", ">= 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { hasher.chain(root, nullptr, 2, 2, out.data()); },
        {"PageHasher::chain", "tokens is null", "numPages * tokensPerPage is 4", "must be 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { hasher.chain(root, tokens, 2, 2, nullptr); },
        {"PageHasher::chain", "out is null", "numPages is 2", "must be 0"}));
    EXPECT_EQ(out, std::vector<PageHash>(2, poison));
    hasher.chain(root, nullptr, 0, 16, nullptr);
    // Pages of no tokens need no token pointer.
    hasher.chain(root, nullptr, 2, 0, out.data());
    EXPECT_EQ(out[0], modelPage(algorithm(), root, {}, {}));
    EXPECT_EQ(out[1], modelPage(algorithm(), out[0], {}, {}));
}

TEST(PageHash, AnAlgorithmOutsideTheEnumerationIsRefused)
{
    auto const bad = static_cast<PageHashAlgorithm>(7);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { PageHasher hasher(bad); }, {"PageHasher", "algorithm is 7", "kSHA256", "kXXH3_128"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { PageHasher hasher(bad, testSeed(0)); }, {"PageHasher", "algorithm is 7"}));
    EXPECT_STREQ(rt::toString(bad), "unknown");
}

TEST(PageHash, NamesAndDefaults)
{
    EXPECT_STREQ(rt::toString(PageHashAlgorithm::kSHA256), "sha256");
    EXPECT_STREQ(rt::toString(PageHashAlgorithm::kXXH3_128), "xxh3-128");
    EXPECT_EQ(PageHasher().algorithm(), PageHashAlgorithm::kSHA256);
}

TEST(PageHash, EqualityComparesBothWordsAndTheHasherTakesLo)
{
    PageHash const a{1, 2};
    EXPECT_TRUE(a == (PageHash{1, 2}));
    EXPECT_FALSE(a != (PageHash{1, 2}));
    EXPECT_TRUE(a != (PageHash{1, 3}));
    EXPECT_TRUE(a != (PageHash{0, 2}));
    EXPECT_FALSE(a == (PageHash{1, 3}));
    EXPECT_EQ(rt::PageHashHasher{}(PageHash{0x123456789abcdef0ull, 7}), static_cast<size_t>(0x123456789abcdef0ull));
    PageHash const zero{};
    EXPECT_EQ(zero.lo, 0u);
    EXPECT_EQ(zero.hi, 0u);
}

TEST(PageHash, NoCollisionsInAMillionRandomXxh3Pages)
{
    PageHasher const hasher(PageHashAlgorithm::kXXH3_128, testSeed(77));
    int32_t const numPages = 1 << 20;
    int32_t const tokensPerPage = 16;
    // Two token values: 65,536 distinct pages, so most pages repeat and only the parent tells them apart.
    std::mt19937 generator(5);
    std::vector<int32_t> tokens(static_cast<size_t>(numPages) * tokensPerPage);
    for (int32_t& token : tokens)
    {
        token = static_cast<int32_t>(generator() % 2);
    }
    std::vector<PageHash> hashes(static_cast<size_t>(numPages));
    hasher.chain(hasher.root(nullptr, 0), tokens.data(), numPages, tokensPerPage, hashes.data());
    std::sort(hashes.begin(), hashes.end(),
        [](PageHash const& x, PageHash const& y) { return x.lo != y.lo ? x.lo < y.lo : x.hi < y.hi; });
    size_t sameLo = 0;
    for (size_t i = 1; i < hashes.size(); ++i)
    {
        ASSERT_NE(hashes[i - 1], hashes[i]) << "a 128-bit collision";
        sameLo += hashes[i - 1].lo == hashes[i].lo ? 1 : 0;
    }
    // 2^40 pairs over 2^64 values: a collision of the low word alone has odds of about 6e-8.
    EXPECT_EQ(sameLo, 0u);
}

} // namespace
} // namespace kvcache::test
