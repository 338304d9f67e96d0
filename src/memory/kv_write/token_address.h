#pragma once

// Where one token of a write or read lands: a token address checked against the layer's pages, or a (sequence,
// position) pair looked up in a CSR page table. Host and device code share these, so host tests check the maths the
// kernel runs.

#include "kvcache/memory/layer_ref.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! A resolved token that is skipped (negative address, negative sequence): neither moved nor counted.
inline constexpr int64_t kSKIPPED_TOKEN = -1;
//! A resolved token whose destination lies outside the layer's pages: counted, never moved.
inline constexpr int64_t kBAD_TOKEN = -2;

//! Returns `address` when it lies in [0, numPages * tokensPerPage), kSKIPPED_TOKEN when it is negative and kBAD_TOKEN
//! otherwise.
KVCACHE_HOST_DEVICE inline int64_t checkTokenAddress(int64_t address, int32_t numPages, int32_t tokensPerPage) noexcept
{
    if (address < 0)
    {
        return kSKIPPED_TOKEN;
    }
    return address < int64_t{numPages} * tokensPerPage ? address : kBAD_TOKEN;
}

//! A CSR page table as the kernel reads it (device or, in tests, host arrays).
struct TableRef
{
    int32_t const* indptr;
    int32_t const* indices;
    int32_t const* firstToken; //!< nullptr: every row starts at position 0
    int32_t numSequences;
};

//! Returns the token address of `position` in row `sequence` of `table`, kSKIPPED_TOKEN for a negative sequence and
//! kBAD_TOKEN for a row outside the table, a position before the row's first page or past its last, or a page id
//! outside [0, numPages). The row's first token is a multiple of tokensPerPage, so the offset in the page is
//! position % tokensPerPage.
KVCACHE_HOST_DEVICE inline int64_t tableTokenAddress(
    TableRef const& table, int32_t sequence, int32_t position, int32_t numPages, int32_t tokensPerPage) noexcept
{
    if (sequence < 0)
    {
        return kSKIPPED_TOKEN;
    }
    if (sequence >= table.numSequences || position < 0)
    {
        return kBAD_TOKEN;
    }
    int32_t const first = table.firstToken == nullptr ? 0 : table.firstToken[sequence];
    if (position < first || first < 0)
    {
        return kBAD_TOKEN;
    }
    int64_t const rowStart = table.indptr[sequence];
    int64_t const rowPages = int64_t{table.indptr[sequence + 1]} - rowStart;
    int64_t const pageInRow = position / tokensPerPage - first / tokensPerPage;
    if (pageInRow >= rowPages)
    {
        return kBAD_TOKEN;
    }
    int32_t const page = table.indices[rowStart + pageInRow];
    if (page < 0 || page >= numPages)
    {
        return kBAD_TOKEN;
    }
    return int64_t{page} * tokensPerPage + position % tokensPerPage;
}

} // namespace kvcache::rt::detail
