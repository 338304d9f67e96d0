// The library's own access to a PageManager: hashNextPages() with what an append needs to take its hashes, and that
// append.
#include "paging/page_manager_internal.h"

#include "paging/page_manager_state.h"

namespace kvcache::rt::detail
{

NextPageHashes PageManagerInternal::hashNextPages(PageManager const& manager, SequenceId sequence,
    int32_t const* tokens, int32_t count, PageHash* out, PageExtraKey const* extraKeys, int32_t numExtraKeys)
{
    PageManager::State& s = *manager.mState;
    int32_t const row = s.sequences.rowOf(sequence, "hashNextPages");
    NextPageHashes known;
    known.count = s.hashNextPages(row, tokens, count, out, extraKeys, numExtraKeys);
    known.sequence = sequence;
    known.parent = s.sequences[row].lastHash;
    known.firstPage = s.sequences[row].length >> s.pageShift;
    known.hashes = out;
    return known;
}

StepCopies PageManagerInternal::appendHashed(
    PageManager& manager, SequenceAppend const& append, NextPageHashes const& known)
{
    PageManager::State& s = *manager.mState;
    s.checkKnownHashes(append, known);
    return s.step(&append, 1, &known);
}

} // namespace kvcache::rt::detail
