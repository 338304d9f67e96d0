#include "kvcache/paging/page_hash.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

// OpenSSL 3 deprecates SHA256_Init/Update in favour of EVP, whose provider dispatch on every call costs about half as
// much again as hashing a 16-token page (docs/benchmarks.md). libcrypto 3 still exports the low-level calls and runs
// them on the same SHA-NI code; only this file uses them.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

// Header-only use (XXH3 compiled into this file): nothing links libxxhash, so consumers need only libcrypto.
#define XXH_INLINE_ALL
#include <xxhash.h>

// getrandom, for the seed.
#include <sys/random.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <cerrno>
#include <cstring>

namespace kvcache::rt
{
namespace
{

// Token ids are hashed as the bytes of the int32 array, which are their little-endian encoding only here.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "page hashes encode token ids as little-endian int32");
static_assert(sizeof(int32_t) == 4, "page hashes encode token ids as 4 bytes");

//! Bytes [16, 20) of a root's message; a page's differ, so no root input equals a page input.
constexpr uint32_t kROOT_DOMAIN = 0;
//! Bytes [16, 20) of a page's message.
constexpr uint32_t kPAGE_DOMAIN = 1;
//! Parent (lo, hi), domain (uint32), count (uint32), extraBytes (uint64). The parent comes first and the tokens start
//! 32 bytes in, so that the hash's loads of them each read within one earlier store: a load that straddles two
//! stores still in flight waits for them to reach the cache, and the parent is written just before it is read.
constexpr size_t kPAGE_HEADER_BYTES = 32;
constexpr size_t kSEED_BYTES = 32;
constexpr size_t kSHA256_BLOCK_BYTES = 64;
//! SHA-256 padding: at least the 0x80 byte and the 8-byte message length.
constexpr size_t kSHA256_MIN_PADDING_BYTES = 9;
//! A page message up to this size (padding included) is built in one stack buffer; a longer one is streamed.
constexpr size_t kBUFFER_BYTES = 2048;

// The machine is little endian (asserted above), so these are plain copies; byte loops would not be merged into
// single moves, and they sit on the chain's critical path.
void storeLe64(uint8_t* bytes, uint64_t value) noexcept
{
    std::memcpy(bytes, &value, sizeof(value));
}

void storeLe32(uint8_t* bytes, uint32_t value) noexcept
{
    std::memcpy(bytes, &value, sizeof(value));
}

uint64_t loadLe64(uint8_t const* bytes) noexcept
{
    uint64_t value = 0;
    std::memcpy(&value, bytes, sizeof(value));
    return value;
}

//! Writes `parent` to bytes [0, 16) in one 16-byte store where the machine has one, for SHA-256's 16-byte loads.
void storeParent(uint8_t* bytes, PageHash parent) noexcept
{
#if defined(__SSE2__)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bytes),
        _mm_set_epi64x(static_cast<long long>(parent.hi), static_cast<long long>(parent.lo)));
#else
    storeLe64(bytes, parent.lo);
    storeLe64(bytes + 8, parent.hi);
#endif
}

//! Writes a page's header but its parent.
void storePageLengths(uint8_t* header, int32_t count, size_t extraBytes) noexcept
{
    storeLe32(header + 16, kPAGE_DOMAIN);
    storeLe32(header + 20, static_cast<uint32_t>(count));
    storeLe64(header + 24, static_cast<uint64_t>(extraBytes));
}

//! Returns the page hash of a SHA-256 state after the last block: the digest is the state words, big-endian.
PageHash fromSha256State(SHA256_CTX const& context) noexcept
{
    uint32_t digest[4];
    for (int word = 0; word < 4; ++word)
    {
        digest[word] = __builtin_bswap32(context.h[word]);
    }
    uint64_t words[2];
    std::memcpy(words, digest, sizeof(words));
    return PageHash{words[0], words[1]};
}

[[noreturn]] void failCrypto(char const* call)
{
    throw Error(fmt::format("PageHasher: {} failed", call));
}

//! One message fed in pieces to either algorithm; for messages too long for a PageMessage and for roots.
class MessageStream
{
public:
    explicit MessageStream(PageHashAlgorithm algorithm)
        : mAlgorithm(algorithm)
    {
        if (mAlgorithm == PageHashAlgorithm::kSHA256)
        {
            if (SHA256_Init(&mSha256) != 1)
            {
                failCrypto("SHA256_Init");
            }
        }
        else if (XXH3_128bits_reset(&mXxh3) != XXH_OK)
        {
            failCrypto("XXH3_128bits_reset");
        }
    }

    void update(void const* data, size_t bytes)
    {
        if (bytes == 0)
        {
            return;
        }
        if (mAlgorithm == PageHashAlgorithm::kSHA256)
        {
            if (SHA256_Update(&mSha256, data, bytes) != 1)
            {
                failCrypto("SHA256_Update");
            }
        }
        else if (XXH3_128bits_update(&mXxh3, data, bytes) != XXH_OK)
        {
            failCrypto("XXH3_128bits_update");
        }
    }

    PageHash finish()
    {
        if (mAlgorithm == PageHashAlgorithm::kSHA256)
        {
            unsigned char digest[SHA256_DIGEST_LENGTH];
            if (SHA256_Final(digest, &mSha256) != 1)
            {
                failCrypto("SHA256_Final");
            }
            return PageHash{loadLe64(digest), loadLe64(digest + 8)};
        }
        XXH128_hash_t const hash = XXH3_128bits_digest(&mXxh3);
        return PageHash{hash.low64, hash.high64};
    }

private:
    PageHashAlgorithm mAlgorithm;
    SHA256_CTX mSha256;
    XXH3_state_t mXxh3;
};

//! Returns the bytes of a page's message: header, tokens, extra.
uint64_t pageMessageBytes(int32_t count, size_t extraBytes) noexcept
{
    return kPAGE_HEADER_BYTES + 4 * static_cast<uint64_t>(count) + static_cast<uint64_t>(extraBytes);
}

//! One page's message in a stack buffer, its SHA-256 padding written once: a chain rewrites only the parent and the
//! tokens of each page, and the padded blocks go straight to the compression function.
class PageMessage
{
public:
    //! Returns whether a page of `count` tokens and `extraBytes` extra bytes fits the buffer, padding included.
    static bool fits(int32_t count, size_t extraBytes) noexcept
    {
        return extraBytes <= kBUFFER_BYTES
            && pageMessageBytes(count, extraBytes) + kSHA256_MIN_PADDING_BYTES <= kBUFFER_BYTES;
    }

    //! Writes the header but the parent, and the padding; requires fits(count, extraBytes).
    PageMessage(PageHashAlgorithm algorithm, int32_t count, size_t extraBytes) noexcept
        : mAlgorithm(algorithm)
        , mMessageBytes(static_cast<size_t>(pageMessageBytes(count, extraBytes)))
    {
        storePageLengths(mBytes, count, extraBytes);
        mHashedBytes = mMessageBytes;
        if (mAlgorithm == PageHashAlgorithm::kSHA256)
        {
            // FIPS 180-4 5.1.1: 0x80, zeros up to 8 bytes short of a block boundary, the message length in bits.
            mHashedBytes = (mMessageBytes + kSHA256_MIN_PADDING_BYTES + kSHA256_BLOCK_BYTES - 1) / kSHA256_BLOCK_BYTES
                * kSHA256_BLOCK_BYTES;
            std::memset(mBytes + mMessageBytes, 0, mHashedBytes - mMessageBytes);
            mBytes[mMessageBytes] = 0x80;
            uint64_t const bits = static_cast<uint64_t>(mMessageBytes) * 8;
            for (size_t i = 0; i < 8; ++i)
            {
                mBytes[mHashedBytes - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
            }
        }
    }

    void setParent(PageHash parent) noexcept
    {
        storeParent(mBytes, parent);
    }

    //! Returns where the tokens go; the extra bytes follow them.
    uint8_t* payload() noexcept
    {
        return mBytes + kPAGE_HEADER_BYTES;
    }

    //! hash() of a kXXH3_128 message of a size known when compiling: XXH3 takes its path for that length.
    template <size_t MESSAGE_BYTES>
    PageHash xxh3() const noexcept
    {
        XXH128_hash_t const hash = XXH3_128bits(mBytes, MESSAGE_BYTES);
        return PageHash{hash.low64, hash.high64};
    }

    PageHash hash() const
    {
        if (mAlgorithm == PageHashAlgorithm::kSHA256)
        {
            // The buffer holds whole padded blocks, so the state after them is the digest; SHA256_Final's copy of a
            // partial block and its separate padding pass are skipped.
            SHA256_CTX context;
            if (SHA256_Init(&context) != 1 || SHA256_Update(&context, mBytes, mHashedBytes) != 1)
            {
                failCrypto("SHA256_Update");
            }
            return fromSha256State(context);
        }
        XXH128_hash_t const hash = XXH3_128bits(mBytes, mHashedBytes);
        return PageHash{hash.low64, hash.high64};
    }

private:
    PageHashAlgorithm mAlgorithm;
    size_t mMessageBytes;
    size_t mHashedBytes;
    alignas(64) uint8_t mBytes[kBUFFER_BYTES];
};

//! Returns the hash of a page too long for a PageMessage, its message fed in pieces.
PageHash hashLongPage(PageHashAlgorithm algorithm, PageHash parent, int32_t const* tokens, int32_t count,
    void const* extra, size_t extraBytes)
{
    uint8_t header[kPAGE_HEADER_BYTES];
    storeParent(header, parent);
    storePageLengths(header, count, extraBytes);
    MessageStream stream(algorithm);
    stream.update(header, sizeof(header));
    stream.update(tokens, 4 * static_cast<size_t>(count));
    stream.update(extra, extraBytes);
    return stream.finish();
}

//! chain() for pages of TOKENS tokens. With the sizes known, the tokens are copied in 16-byte moves that the hash's
//! 8-byte loads read straight from the store buffer, and XXH3 runs its path for that length; a runtime-sized memcpy
//! and length made a 16-token page take three times as long (24 against 8 ns).
template <int32_t TOKENS>
void chainFixed(PageHashAlgorithm algorithm, PageHash parent, int32_t const* tokens, int32_t numPages, PageHash* out)
{
    constexpr size_t kTOKEN_BYTES = 4 * static_cast<size_t>(TOKENS);
    PageMessage message(algorithm, TOKENS, 0);
    auto const run = [&](auto hash)
    {
        for (int32_t page = 0; page < numPages; ++page)
        {
            message.setParent(parent);
            std::memcpy(message.payload(), tokens + static_cast<size_t>(page) * TOKENS, kTOKEN_BYTES);
            parent = hash();
            out[page] = parent;
        }
    };
    if (algorithm == PageHashAlgorithm::kXXH3_128)
    {
        run([&] { return message.xxh3<kPAGE_HEADER_BYTES + kTOKEN_BYTES>(); });
    }
    else
    {
        run([&] { return message.hash(); });
    }
}

std::array<uint8_t, kSEED_BYTES> randomSeed()
{
    std::array<uint8_t, kSEED_BYTES> seed{};
    size_t filled = 0;
    while (filled < seed.size())
    {
        ssize_t const got = getrandom(seed.data() + filled, seed.size() - filled, 0);
        if (got < 0)
        {
            if (errno == EINTR)
            {
                continue;
            }
            throw Error(fmt::format(
                "PageHasher: getrandom failed for the {}-byte seed: {}", seed.size(), std::strerror(errno)));
        }
        filled += static_cast<size_t>(got);
    }
    return seed;
}

void checkAlgorithm(PageHashAlgorithm algorithm)
{
    if (algorithm != PageHashAlgorithm::kSHA256 && algorithm != PageHashAlgorithm::kXXH3_128)
    {
        throw InvalidArgumentError(fmt::format(
            "PageHasher: algorithm is {}; it must be 0 (kSHA256) or 1 (kXXH3_128)", static_cast<int32_t>(algorithm)));
    }
}

} // namespace

char const* toString(PageHashAlgorithm algorithm) noexcept
{
    switch (algorithm)
    {
    case PageHashAlgorithm::kSHA256: return "sha256";
    case PageHashAlgorithm::kXXH3_128: return "xxh3-128";
    }
    return "unknown";
}

PageHasher::PageHasher(PageHashAlgorithm algorithm)
    : mAlgorithm(algorithm)
    , mSeed{}
{
    checkAlgorithm(algorithm);
    mSeed = randomSeed();
}

PageHasher::PageHasher(PageHashAlgorithm algorithm, std::array<uint8_t, 32> const& seed)
    : mAlgorithm(algorithm)
    , mSeed(seed)
{
    checkAlgorithm(algorithm);
}

PageHash PageHasher::root(void const* salt, size_t saltBytes) const
{
    if (salt == nullptr && saltBytes > 0)
    {
        throw InvalidArgumentError(
            fmt::format("PageHasher::root: salt is null but saltBytes is {}; it must be 0 for a null salt", saltBytes));
    }
    uint8_t header[16 + 4 + kSEED_BYTES + 8] = {};
    storeLe32(header + 16, kROOT_DOMAIN);
    std::memcpy(header + 20, mSeed.data(), kSEED_BYTES);
    storeLe64(header + 20 + kSEED_BYTES, static_cast<uint64_t>(saltBytes));
    MessageStream stream(mAlgorithm);
    stream.update(header, sizeof(header));
    stream.update(salt, saltBytes);
    return stream.finish();
}

PageHash PageHasher::next(
    PageHash parent, int32_t const* tokens, int32_t count, void const* extra, size_t extraBytes) const
{
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("PageHasher::next: count is {}; it must be >= 0", count));
    }
    if (tokens == nullptr && count > 0)
    {
        throw InvalidArgumentError(
            fmt::format("PageHasher::next: tokens is null but count is {}; it must be 0 for null tokens", count));
    }
    if (extra == nullptr && extraBytes > 0)
    {
        throw InvalidArgumentError(fmt::format(
            "PageHasher::next: extra is null but extraBytes is {}; it must be 0 for null extra", extraBytes));
    }
    if (!PageMessage::fits(count, extraBytes))
    {
        return hashLongPage(mAlgorithm, parent, tokens, count, extra, extraBytes);
    }
    PageMessage message(mAlgorithm, count, extraBytes);
    message.setParent(parent);
    size_t const tokenBytes = 4 * static_cast<size_t>(count);
    if (tokenBytes > 0)
    {
        std::memcpy(message.payload(), tokens, tokenBytes);
    }
    if (extraBytes > 0)
    {
        std::memcpy(message.payload() + tokenBytes, extra, extraBytes);
    }
    return message.hash();
}

void PageHasher::chain(
    PageHash parent, int32_t const* tokens, int32_t numPages, int32_t tokensPerPage, PageHash* out) const
{
    if (numPages < 0)
    {
        throw InvalidArgumentError(fmt::format("PageHasher::chain: numPages is {}; it must be >= 0", numPages));
    }
    if (tokensPerPage < 0)
    {
        throw InvalidArgumentError(
            fmt::format("PageHasher::chain: tokensPerPage is {}; it must be >= 0", tokensPerPage));
    }
    int64_t const numTokens = static_cast<int64_t>(numPages) * tokensPerPage;
    if (tokens == nullptr && numTokens > 0)
    {
        throw InvalidArgumentError(fmt::format("PageHasher::chain: tokens is null but numPages * tokensPerPage is "
                                               "{}; it must be 0 for null tokens",
            numTokens));
    }
    if (out == nullptr && numPages > 0)
    {
        throw InvalidArgumentError(
            fmt::format("PageHasher::chain: out is null but numPages is {}; it must be 0 for a null out", numPages));
    }
    size_t const pageTokens = static_cast<size_t>(tokensPerPage);
    if (!PageMessage::fits(tokensPerPage, 0))
    {
        for (int32_t page = 0; page < numPages; ++page)
        {
            parent = hashLongPage(
                mAlgorithm, parent, tokens + static_cast<size_t>(page) * pageTokens, tokensPerPage, nullptr, 0);
            out[page] = parent;
        }
        return;
    }
    switch (tokensPerPage)
    {
    case 16: chainFixed<16>(mAlgorithm, parent, tokens, numPages, out); return;
    case 32: chainFixed<32>(mAlgorithm, parent, tokens, numPages, out); return;
    default: break;
    }
    PageMessage message(mAlgorithm, tokensPerPage, 0);
    size_t const tokenBytes = 4 * pageTokens;
    for (int32_t page = 0; page < numPages; ++page)
    {
        message.setParent(parent);
        if (tokenBytes > 0)
        {
            std::memcpy(message.payload(), tokens + static_cast<size_t>(page) * pageTokens, tokenBytes);
        }
        parent = message.hash();
        out[page] = parent;
    }
}

} // namespace kvcache::rt
