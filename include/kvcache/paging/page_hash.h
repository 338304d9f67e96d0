#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace kvcache::rt
{

//! 128 bits of a chained page hash: a plain value; == and != compare both words.
struct PageHash
{
    //! Bytes [0, 8) of the digest, read as a little-endian integer.
    uint64_t lo = 0;
    //! Bytes [8, 16) of the digest, read as a little-endian integer.
    uint64_t hi = 0;
};

//! Returns whether both words of `a` and `b` are equal; never throws.
inline bool operator==(PageHash a, PageHash b) noexcept
{
    return a.lo == b.lo && a.hi == b.hi;
}

//! Returns whether a word of `a` differs from that of `b`; never throws.
inline bool operator!=(PageHash a, PageHash b) noexcept
{
    return !(a == b);
}

//! Hash functor for unordered containers and open addressing: returns `lo`, already uniformly distributed because it
//! is the output of the page hash; never throws.
struct PageHashHasher
{
    //! Returns the low word of `hash`; never throws.
    size_t operator()(PageHash hash) const noexcept
    {
        return static_cast<size_t>(hash.lo);
    }
};

//! The function a PageHasher hashes with.
enum class PageHashAlgorithm : int32_t
{
    //! SHA-256 (OpenSSL), the first 128 bits of the digest: collision resistant.
    kSHA256 = 0,
    //! XXH3 128-bit (xxHash >= 0.8, whose output is stable): several times faster, but not collision resistant
    //! against a party that knows the seed.
    kXXH3_128 = 1,
};

//! Returns "sha256" or "xxh3-128", or "unknown" for a value outside the enumeration; never throws.
char const* toString(PageHashAlgorithm algorithm) noexcept;

//! Chained content hashes of the full pages of a sequence, for prefix reuse: two sequences share a page only when
//! their page hashes, and so every page before it, are equal.
//!
//! A chain starts at root(salt) and each page's hash is next(parent, tokens, extra). Both algorithms hash the same
//! byte strings (integers little-endian):
//!
//!     root:  0 (uint64) | 0 (uint64) | 0 (uint32) | seed (32 bytes) | saltBytes (uint64) | salt
//!     page:  parent.lo (uint64) | parent.hi (uint64) | 1 (uint32) | count (uint32) | extraBytes (uint64)
//!            | tokens (count int32) | extra
//!
//! Bytes [16, 20), the domain, keep root and page inputs apart; the lengths keep the boundary between tokens and
//! extra fixed.
//! The hash's `lo` and `hi` are bytes [0, 8) and [8, 16) of the digest (SHA-256) read as little-endian integers, or
//! XXH3_128bits' low64 and high64 (kXXH3_128). The seed enters only through the root, which every chain starts from.
//! A 16-token page without extra bytes is 96 bytes, two SHA-256 blocks.
//!
//! A plain value (copyable, movable); every member function is const and keeps no state between calls, so one
//! PageHasher may be used from any number of threads at once.
class PageHasher
{
public:
    //! Returns a hasher whose 32-byte seed is drawn from the operating system, so that hashes differ between
    //! processes and a cached page cannot be targeted from outside. Throws InvalidArgumentError naming `algorithm`
    //! for a value outside the enumeration and Error when the operating system gives no random bytes.
    explicit PageHasher(PageHashAlgorithm algorithm = PageHashAlgorithm::kSHA256);
    //! Returns a hasher of the given seed: the same tokens give the same hashes in every process (pages saved to
    //! files can be found again). Throws InvalidArgumentError naming `algorithm` for a value outside the enumeration.
    PageHasher(PageHashAlgorithm algorithm, std::array<uint8_t, 32> const& seed);

    //! Returns the algorithm; never throws.
    PageHashAlgorithm algorithm() const noexcept
    {
        return mAlgorithm;
    }
    //! Returns the seed; never throws.
    std::array<uint8_t, 32> const& seed() const noexcept
    {
        return mSeed;
    }

    //! Returns the parent of every sequence's first page: a hash of the seed and of `salt[0, saltBytes)` (a tenant's
    //! salt, a LoRA id, ...; empty is salt == nullptr and saltBytes == 0). Different salts give different roots, so
    //! sequences of different salts never share a page. Throws InvalidArgumentError for a null salt with
    //! saltBytes > 0.
    PageHash root(void const* salt, size_t saltBytes) const;

    //! Returns the hash of one page: its parent's hash, `tokens[0, count)` and `extra[0, extraBytes)` (extra key
    //! bytes of the page, e.g. the hash of a multimodal item placed in it; nullptr and 0 for none). Throws
    //! InvalidArgumentError for a negative count, a null `tokens` with count > 0 or a null `extra` with
    //! extraBytes > 0.
    PageHash next(PageHash parent, int32_t const* tokens, int32_t count, void const* extra, size_t extraBytes) const;

    //! Writes the hashes of `numPages` consecutive full pages of `tokensPerPage` tokens each, without extra bytes,
    //! to `out[0, numPages)`: out[0] = next(parent, tokens[0, P)), out[i] = next(out[i - 1], tokens[iP, (i + 1)P)).
    //! The same results as next() in a loop, faster (a prompt's pages). Throws InvalidArgumentError for a negative
    //! numPages or tokensPerPage, or a null `tokens` or `out` when there is something to read or write; writes
    //! nothing then.
    void chain(PageHash parent, int32_t const* tokens, int32_t numPages, int32_t tokensPerPage, PageHash* out) const;

private:
    PageHashAlgorithm mAlgorithm;
    std::array<uint8_t, 32> mSeed;
};

} // namespace kvcache::rt
