#pragma once

// What the library's own layers reach in a PageManager beyond its public calls: an append that registers the pages it
// fills under hashes hashNextPages() computed already, so that a run looked up by hash in another tier (the tiered
// prefix cache's host pages) is hashed once. Not installed: a runtime cannot pass hashes of its own.

#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Hashes of the pages [firstPage, firstPage + count) of `sequence`, as hashNextPages() computed them when the sequence
//! held firstPage whole pages and the hash of its last full page (its root when none) was `parent`.
struct NextPageHashes
{
    SequenceId sequence = -1;
    PageHash parent = {};
    int32_t firstPage = 0;
    int32_t count = 0;
    PageHash const* hashes = nullptr;
};

class PageManagerInternal
{
public:
    //! PageManager::hashNextPages(sequence, tokens, count, out, extraKeys, numExtraKeys), returning with the hashes
    //! written to out what appendHashed() needs to take them (count: how many were written). Throws what
    //! hashNextPages throws.
    static NextPageHashes hashNextPages(PageManager const& manager, SequenceId sequence, int32_t const* tokens,
        int32_t count, PageHash* out, PageExtraKey const* extraKeys, int32_t numExtraKeys);

    //! PageManager::append(append), except that each page of `known.sequence` the append fills whose index lies in
    //! [known.firstPage, known.firstPage + known.count) is registered under known.hashes[index - known.firstPage]
    //! instead of being hashed; other pages are hashed as append() does. Precondition, which only a hash computation
    //! could check (debug builds do): the append's tokens and extra keys at those pages' positions are those the
    //! hashes were computed from (the same arguments to hashNextPages, sliced), so that every page gets the hash
    //! append() would give it. Checked, before anything changes: the sequence is known.sequence, it holds between
    //! known.firstPage and known.firstPage + known.count whole pages (and at most a partial one more), and its hash
    //! chain is the one the hashes continue (the last full page's hash is `parent` or the known hash before it).
    //! Throws what append() throws, and InvalidArgumentError naming the sequence, its length and the known pages when
    //! a check fails.
    static StepCopies appendHashed(PageManager& manager, SequenceAppend const& append, NextPageHashes const& known);
};

} // namespace kvcache::rt::detail
