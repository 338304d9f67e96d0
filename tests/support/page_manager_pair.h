#pragma once

// A PageManager and the independent model (page_manager_model.h) side by side: every call goes to both and the manager
// is checked against the model after each (snapshot, eviction callback calls, invariants).

#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "support/error_matchers.h"
#include "support/page_manager_model.h"
#include "support/page_manager_snapshot.h"

namespace kvcache::test
{

//! A manager and the model side by side: every call goes to both and is checked against the model.
class PageManagerPair
{
public:
    //! Retention durations run on the model's clock (model.setNow) unless `options` has a clock of its own.
    PageManagerPair(rt::KVCacheConfig const& config, rt::PageManagerOptions const& options)
        : manager(config, withModelClock(options))
        , model(shapesOf(manager.layout()), manager.layout().tokensPerPage, config.maxSequenceLength,
              manager.layout().maxTokensPerStep, manager.maxSequences(), options.enablePrefixCaching,
              rt::PageHasher(options.hashAlgorithm, *options.hashSeed))
    {
        manager.setEvictionCallback(
            [this](int32_t group, int32_t page, rt::PageHash hash) {
                evicted.push_back({group, page, hash});
            });
    }

    rt::PageManagerOptions withModelClock(rt::PageManagerOptions options)
    {
        if (!options.clock)
        {
            options.clock = [this] { return model.now(); };
        }
        return options;
    }

    static std::vector<PageManagerModel::GroupShape> shapesOf(rt::KVCacheLayout const& layout)
    {
        std::vector<PageManagerModel::GroupShape> shapes;
        for (rt::KVPageGroupLayout const& group : layout.groups)
        {
            shapes.push_back({group.slidingWindow, group.numPages});
        }
        return shapes;
    }

    std::vector<rt::SequenceId> ids() const
    {
        std::vector<rt::SequenceId> list;
        for (auto const& entry : model.sequences())
        {
            list.push_back(entry.first);
        }
        return list;
    }

    //! Checks the manager against the model: snapshot, evictions, invariants.
    void expectMatch() const
    {
        EXPECT_EQ(differenceOf(snapshotOf(manager, ids(), copies), snapshotOf(model)), "");
        ASSERT_EQ(evicted.size(), model.evictions().size());
        for (size_t i = 0; i < evicted.size(); ++i)
        {
            EXPECT_EQ(evicted[i].group, model.evictions()[i].group) << "eviction " << i;
            EXPECT_EQ(evicted[i].page, model.evictions()[i].page) << "eviction " << i;
        }
        EXPECT_NO_THROW(manager.checkInvariants());
    }

    rt::SequenceId create(void const* salt = nullptr, size_t saltBytes = 0)
    {
        rt::SequenceOptions options;
        options.salt = salt;
        options.saltBytes = saltBytes;
        rt::SequenceId const id = manager.create(options);
        EXPECT_EQ(model.create(id, salt, saltBytes), ModelOutcome::kOK);
        expectMatch();
        return id;
    }
    void append(rt::SequenceId id, std::vector<int32_t> const& tokens, std::vector<rt::PageExtraKey> const& keys = {})
    {
        rt::SequenceAppend a{
            id, tokens.data(), static_cast<int32_t>(tokens.size()), keys.data(), static_cast<int32_t>(keys.size())};
        copies.add(manager.append(a));
        EXPECT_EQ(model.step(&a, 1), ModelOutcome::kOK);
        expectMatch();
    }
    //! Creates a sequence (no salt) and appends `tokens` to it.
    rt::SequenceId createWith(std::vector<int32_t> const& tokens)
    {
        rt::SequenceId const id = create();
        append(id, tokens);
        return id;
    }
    void step(std::vector<rt::SequenceAppend> const& appends)
    {
        copies.add(manager.step(appends.data(), static_cast<int32_t>(appends.size())));
        EXPECT_EQ(model.step(appends.data(), static_cast<int32_t>(appends.size())), ModelOutcome::kOK);
        expectMatch();
    }
    int32_t adopt(rt::SequenceId id, std::vector<int32_t> const& tokens, std::vector<rt::PageExtraKey> const& keys = {})
    {
        int32_t const got = manager.adoptPrefix(
            id, tokens.data(), static_cast<int32_t>(tokens.size()), keys.data(), static_cast<int32_t>(keys.size()));
        int32_t expected = -1;
        EXPECT_EQ(model.adoptPrefix(id, tokens.data(), static_cast<int32_t>(tokens.size()), keys.data(),
                      static_cast<int32_t>(keys.size()), &expected),
            ModelOutcome::kOK);
        EXPECT_EQ(got, expected);
        expectMatch();
        return got;
    }
    rt::SequenceId fork(rt::SequenceId parent)
    {
        rt::SequenceId const child = manager.fork(parent);
        EXPECT_EQ(model.fork(parent, child), ModelOutcome::kOK);
        expectMatch();
        return child;
    }
    void retain(rt::SequenceId id, int32_t firstToken, int32_t endToken, int32_t priority,
        int64_t durationMs = rt::PageManager::kNO_DURATION)
    {
        manager.setRetention(id, firstToken, endToken, priority, durationMs);
        EXPECT_EQ(model.setRetention(id, firstToken, endToken, priority, durationMs), ModelOutcome::kOK);
        expectMatch();
    }
    void free(rt::SequenceId id)
    {
        manager.free(id);
        EXPECT_EQ(model.free(id), ModelOutcome::kOK);
        expectMatch();
    }
    int32_t evict(int32_t group, int32_t count)
    {
        int32_t const got = manager.evictCached(group, count);
        int32_t expected = -1;
        EXPECT_EQ(model.evictCached(group, count, &expected), ModelOutcome::kOK);
        EXPECT_EQ(got, expected);
        expectMatch();
        return got;
    }
    std::vector<int32_t> pages(rt::SequenceId id, int32_t group = 0) const
    {
        rt::SequencePages const p = manager.pages(id, group);
        return {p.pages, p.pages + p.numPages};
    }
    PageManagerSnapshot snapshot() const
    {
        return snapshotOf(manager, ids(), copies);
    }

    rt::PageManager manager;
    PageManagerModel model;
    //! The copies of the steps since the last clearCopies().
    CopyLog copies;
    std::vector<ModelEviction> evicted;
};

//! Returns the pages the eviction callback reported for `group`, in order.
inline std::vector<int32_t> evictedPages(PageManagerPair const& pair, int32_t group)
{
    std::vector<int32_t> pages;
    for (ModelEviction const& eviction : pair.evicted)
    {
        if (eviction.group == group)
        {
            pages.push_back(eviction.page);
        }
    }
    return pages;
}

//! Checks that `call` throws `Error` with a message naming each of `words`, and that it changed nothing the pair can
//! observe (snapshot, eviction callback calls) and left the manager consistent.
template <typename Error, typename Call>
void expectRejected(PageManagerPair& pair, Call&& call, std::vector<std::string> const& words)
{
    PageManagerSnapshot const before = pair.snapshot();
    std::vector<ModelEviction> const evicted = pair.evicted;
    EXPECT_TRUE(throwsNaming<Error>(call, words));
    EXPECT_EQ(differenceOf(pair.snapshot(), before), "");
    EXPECT_EQ(pair.evicted.size(), evicted.size());
    EXPECT_NO_THROW(pair.manager.checkInvariants());
}

} // namespace kvcache::test
