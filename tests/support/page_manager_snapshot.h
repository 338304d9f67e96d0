#pragma once

// What a PageManager's caller can observe, taken the same way from a manager and from the tests' model
// (page_manager_model.h): the counts, copies, retention priorities and stats of every group and the pages of the
// listed sequences; and the first difference between two such snapshots, as a message that names the query.

#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "support/page_manager_model.h"

namespace kvcache::test
{

//! Everything a PageManager's caller can observe of the listed sequences and of every group.
struct PageManagerSnapshot
{
    std::vector<rt::PageGroupCounts> counts;
    std::vector<std::vector<rt::PageCopy>> copies;
    rt::PageManagerStats stats = {};
    int32_t numSequences = 0;
    //! Per sequence: its length and its entries in each group.
    std::map<rt::SequenceId, std::pair<int32_t, std::vector<std::vector<int32_t>>>> sequences;
    //! Per group, every page's retention priority.
    std::vector<std::vector<int32_t>> priorities;
};

//! The copies a PageManager's steps returned, per group, since the last clear(): what the model queues.
struct CopyLog
{
    std::vector<std::vector<rt::PageCopy>> groups;

    //! Appends the copies one step returned; returns them.
    rt::StepCopies add(rt::StepCopies const& copies)
    {
        groups.resize(static_cast<size_t>(std::max<int32_t>(copies.numGroups(), static_cast<int32_t>(groups.size()))));
        for (int32_t g = 0; g < copies.numGroups(); ++g)
        {
            groups[static_cast<size_t>(g)].insert(
                groups[static_cast<size_t>(g)].end(), copies[g].begin(), copies[g].end());
        }
        return copies;
    }
    //! Returns the copies of `group` (none when no step ran).
    std::vector<rt::PageCopy> group(int32_t g) const
    {
        return static_cast<size_t>(g) < groups.size() ? groups[static_cast<size_t>(g)] : std::vector<rt::PageCopy>{};
    }
    void clear()
    {
        groups.clear();
    }
};

//! Returns the snapshot of `manager` with the sequences `ids` (all alive) and the copies its steps returned.
inline PageManagerSnapshot snapshotOf(
    rt::PageManager const& manager, std::vector<rt::SequenceId> const& ids, CopyLog const& copies)
{
    PageManagerSnapshot snapshot;
    for (int32_t g = 0; g < manager.numGroups(); ++g)
    {
        snapshot.counts.push_back(manager.counts(g));
        snapshot.copies.push_back(copies.group(g));
        snapshot.priorities.emplace_back();
        for (int32_t page = 0; page < manager.counts(g).numPages; ++page)
        {
            snapshot.priorities.back().push_back(manager.retentionPriority(g, page));
        }
    }
    snapshot.stats = manager.stats();
    snapshot.numSequences = manager.numSequences();
    for (rt::SequenceId const id : ids)
    {
        auto& entry = snapshot.sequences[id];
        entry.first = manager.length(id);
        for (int32_t g = 0; g < manager.numGroups(); ++g)
        {
            rt::SequencePages const pages = manager.pages(id, g);
            entry.second.emplace_back(pages.pages, pages.pages + pages.numPages);
        }
    }
    return snapshot;
}

//! Returns the snapshot the model predicts for the sequences `ids` (all of them when empty).
inline PageManagerSnapshot snapshotOf(PageManagerModel const& model, std::vector<rt::SequenceId> const& ids = {})
{
    PageManagerSnapshot snapshot;
    for (int32_t g = 0; g < model.numGroups(); ++g)
    {
        snapshot.counts.push_back(model.counts(g));
        snapshot.copies.push_back(model.group(g).copies);
        snapshot.priorities.emplace_back();
        for (int32_t page = 0; page < model.group(g).numPages; ++page)
        {
            snapshot.priorities.back().push_back(model.group(g).priorityOf(page));
        }
    }
    snapshot.stats = model.stats();
    snapshot.numSequences = static_cast<int32_t>(model.sequences().size());
    for (auto const& [id, sequence] : model.sequences())
    {
        if (ids.empty() || std::find(ids.begin(), ids.end(), id) != ids.end())
        {
            snapshot.sequences[id] = {sequence.length, sequence.entries};
        }
    }
    return snapshot;
}

//! Returns a description of the first difference between two snapshots, or an empty string when they are equal.
inline std::string differenceOf(PageManagerSnapshot const& actual, PageManagerSnapshot const& expected)
{
    auto list = [](std::vector<int32_t> const& values)
    {
        std::string text = "[";
        for (size_t i = 0; i < values.size(); ++i)
        {
            text += (i > 0 ? " " : "") + std::to_string(values[i]);
        }
        return text + "]";
    };
    if (actual.counts.size() != expected.counts.size())
    {
        return "group count " + std::to_string(actual.counts.size()) + " vs " + std::to_string(expected.counts.size());
    }
    for (size_t g = 0; g < actual.counts.size(); ++g)
    {
        rt::PageGroupCounts const& a = actual.counts[g];
        rt::PageGroupCounts const& e = expected.counts[g];
        if (a.numPages != e.numPages || a.free != e.free || a.used != e.used || a.cached != e.cached
            || a.shared != e.shared || a.anchored != e.anchored)
        {
            return "counts(" + std::to_string(g) + ") {numPages, free, used, cached, shared, anchored} = "
                + list({a.numPages, a.free, a.used, a.cached, a.shared, a.anchored}) + ", expected "
                + list({e.numPages, e.free, e.used, e.cached, e.shared, e.anchored});
        }
        std::vector<int32_t> flatA;
        std::vector<int32_t> flatE;
        for (rt::PageCopy const& copy : actual.copies[g])
        {
            flatA.insert(flatA.end(), {copy.src, copy.dst});
        }
        for (rt::PageCopy const& copy : expected.copies[g])
        {
            flatE.insert(flatE.end(), {copy.src, copy.dst});
        }
        if (flatA != flatE)
        {
            return "copies(" + std::to_string(g) + ") as src dst pairs = " + list(flatA) + ", expected " + list(flatE);
        }
        if (actual.priorities[g] != expected.priorities[g])
        {
            return "retentionPriority(" + std::to_string(g) + ", page) by page = " + list(actual.priorities[g])
                + ", expected " + list(expected.priorities[g]);
        }
    }
    rt::PageManagerStats const& a = actual.stats;
    rt::PageManagerStats const& e = expected.stats;
    if (a.prefixQueryTokens != e.prefixQueryTokens || a.prefixHitTokens != e.prefixHitTokens
        || a.evictedPages != e.evictedPages || a.copyOnWritePages != e.copyOnWritePages)
    {
        auto text = [](rt::PageManagerStats const& s)
        {
            return "{query " + std::to_string(s.prefixQueryTokens) + ", hit " + std::to_string(s.prefixHitTokens)
                + ", evicted " + std::to_string(s.evictedPages) + ", copyOnWrite " + std::to_string(s.copyOnWritePages)
                + "}";
        };
        return "stats() = " + text(a) + ", expected " + text(e);
    }
    if (actual.numSequences != expected.numSequences)
    {
        return "numSequences() = " + std::to_string(actual.numSequences) + ", expected "
            + std::to_string(expected.numSequences);
    }
    if (actual.sequences.size() != expected.sequences.size())
    {
        return "snapshots of " + std::to_string(actual.sequences.size()) + " and "
            + std::to_string(expected.sequences.size()) + " sequences";
    }
    for (auto const& [id, seq] : expected.sequences)
    {
        auto found = actual.sequences.find(id);
        if (found == actual.sequences.end())
        {
            return "sequence " + std::to_string(id) + " missing";
        }
        if (found->second.first != seq.first)
        {
            return "length(" + std::to_string(id) + ") = " + std::to_string(found->second.first) + ", expected "
                + std::to_string(seq.first);
        }
        for (size_t g = 0; g < seq.second.size(); ++g)
        {
            if (found->second.second[g] != seq.second[g])
            {
                return "pages(" + std::to_string(id) + ", " + std::to_string(g) + ") = " + list(found->second.second[g])
                    + ", expected " + list(seq.second[g]);
            }
        }
    }
    return {};
}

} // namespace kvcache::test
