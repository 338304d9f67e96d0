// Host tests of the prefix counters: per tenant (salt) hits of a run whose hits are known, the bucket of salts past
// kMAX_TENANTS, resetStats(), and the Prometheus text of a snapshot against text written out by hand.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/prefix_counters.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"

namespace kvcache::rt
{
namespace
{

using test::throwsNaming;
using test::tokensFrom;

constexpr int32_t kP = 4;

KVCacheConfig oneGroup()
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(1)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(32)
        .numPagesPerGroup({32});
}

//! Creates a sequence of `salt`, adopts what is cached of `prompt`, appends the rest and frees it; returns the hit.
int32_t serve(PageManager& manager, std::string const& salt, std::vector<int32_t> const& prompt)
{
    SequenceId const sequence = manager.create(SequenceOptions{salt.empty() ? nullptr : salt.data(), salt.size()});
    auto const count = static_cast<int32_t>(prompt.size());
    int32_t const hit = manager.adoptPrefix(sequence, prompt.data(), count);
    manager.append({sequence, prompt.data() + hit, count - hit, nullptr, 0});
    manager.free(sequence);
    return hit;
}

std::vector<uint8_t> bytes(std::string const& text)
{
    return {text.begin(), text.end()};
}

TEST(PrefixCounters, TenantsCountTheirOwnQueriesAndHits)
{
    PageManager manager(oneGroup(), test::seededOptions(2, 3));
    std::vector<int32_t> const prompt = tokensFrom(1, 13);
    // Tenant "a" twice: the second finds the 3 whole pages before the last token (12 tokens); "b" and no salt find
    // nothing of "a"'s pages; "b" again finds its own 12.
    EXPECT_EQ(serve(manager, "a", prompt), 0);
    EXPECT_EQ(serve(manager, "a", prompt), 12);
    EXPECT_EQ(serve(manager, "b", prompt), 0);
    EXPECT_EQ(serve(manager, "", prompt), 0);
    EXPECT_EQ(serve(manager, "b", prompt), 12);
    std::vector<PrefixTenantStats> const tenants = manager.tenantStats();
    ASSERT_EQ(tenants.size(), 3u);
    EXPECT_EQ(tenants[0].salt, bytes("a"));
    EXPECT_EQ(tenants[0].queryTokens, 26);
    EXPECT_EQ(tenants[0].deviceHitTokens, 12);
    EXPECT_EQ(tenants[1].salt, bytes("b"));
    EXPECT_EQ(tenants[1].queryTokens, 26);
    EXPECT_EQ(tenants[1].deviceHitTokens, 12);
    EXPECT_TRUE(tenants[2].salt.empty());
    EXPECT_FALSE(tenants[2].other);
    EXPECT_EQ(tenants[2].queryTokens, 13);
    EXPECT_EQ(tenants[2].deviceHitTokens, 0);
    // The manager's own counters are the tenants' sums.
    EXPECT_EQ(manager.stats().prefixQueryTokens, 65);
    EXPECT_EQ(manager.stats().prefixHitTokens, 24);

    // A fork counts for its parent's tenant.
    SequenceId const parent = manager.create(SequenceOptions{"b", 1});
    SequenceId const child = manager.fork(parent);
    manager.free(parent);
    EXPECT_EQ(manager.adoptPrefix(child, prompt.data(), 13), 12);
    manager.free(child);
    EXPECT_EQ(manager.tenantStats()[1].queryTokens, 39);
    EXPECT_EQ(manager.tenantStats()[1].deviceHitTokens, 24);

    manager.resetStats();
    std::vector<PrefixTenantStats> const reset = manager.tenantStats();
    ASSERT_EQ(reset.size(), 3u);
    EXPECT_EQ(reset[1].salt, bytes("b")) << "the tenants seen stay listed";
    EXPECT_EQ(reset[1].queryTokens, 0);
    EXPECT_EQ(reset[1].deviceHitTokens, 0);
}

TEST(PrefixCounters, SaltsPastTheLimitShareTheOtherBucket)
{
    PageManager manager(oneGroup(), test::seededOptions(2, 3));
    std::vector<int32_t> const prompt = tokensFrom(1, 5);
    for (int32_t t = 0; t < PageManager::kMAX_TENANTS + 2; ++t)
    {
        serve(manager, "tenant" + std::to_string(t), prompt);
    }
    std::vector<PrefixTenantStats> const tenants = manager.tenantStats();
    ASSERT_EQ(tenants.size(), static_cast<size_t>(PageManager::kMAX_TENANTS) + 1);
    EXPECT_EQ(tenants[0].salt, bytes("tenant0"));
    EXPECT_EQ(tenants[0].queryTokens, 5);
    EXPECT_TRUE(tenants.back().other);
    EXPECT_EQ(tenants.back().queryTokens, 10) << "two salts past the limit";
}

TEST(PrefixCounters, PrometheusText)
{
    PageManager manager(oneGroup(), test::seededOptions(2, 3));
    std::vector<int32_t> const prompt = tokensFrom(1, 13);
    serve(manager, "a", prompt);
    serve(manager, "a", prompt);
    PrefixCacheCounters const counters = snapshotCounters(manager);
    EXPECT_FALSE(counters.hasTiers);
    std::string const expected = "# HELP kv_prefix_query_tokens_total Prompt tokens looked up in the prefix cache.\n"
                                 "# TYPE kv_prefix_query_tokens_total counter\n"
                                 "kv_prefix_query_tokens_total 26\n"
                                 "# HELP kv_prefix_hit_tokens_total Prompt tokens found in the prefix cache, by tier.\n"
                                 "# TYPE kv_prefix_hit_tokens_total counter\n"
                                 "kv_prefix_hit_tokens_total{tier=\"device\"} 12\n"
                                 "# HELP kv_evicted_pages_total Cached pages whose content was dropped to make room, "
                                 "by tier.\n"
                                 "# TYPE kv_evicted_pages_total counter\n"
                                 "kv_evicted_pages_total{tier=\"device\"} 0\n"
                                 "# HELP kv_copy_on_write_pages_total Pages copied because a sequence wrote to a page "
                                 "it shared.\n"
                                 "# TYPE kv_copy_on_write_pages_total counter\n"
                                 "kv_copy_on_write_pages_total 0\n"
                                 "# HELP kv_tenant_prefix_query_tokens_total Prompt tokens looked up in the prefix "
                                 "cache, by tenant (salt, hex).\n"
                                 "# TYPE kv_tenant_prefix_query_tokens_total counter\n"
                                 "kv_tenant_prefix_query_tokens_total{tenant=\"61\"} 26\n"
                                 "# HELP kv_tenant_prefix_hit_tokens_total Prompt tokens found in the prefix cache, "
                                 "by tenant (salt, hex) and tier.\n"
                                 "# TYPE kv_tenant_prefix_hit_tokens_total counter\n"
                                 "kv_tenant_prefix_hit_tokens_total{tenant=\"61\",tier=\"device\"} 12\n";
    EXPECT_EQ(toPrometheusText(counters, "kv"), expected);

    // With tiers: host and disk hits apart (a disk hit is not a host hit), and the tiers' own counters.
    PrefixCacheCounters tiered = counters;
    tiered.hasTiers = true;
    tiered.tiers.hostHitTokens = 20;
    tiered.tiers.diskHitTokens = 16;
    tiered.tiers.offloadedPages = 7;
    std::string const text = toPrometheusText(tiered);
    for (char const* line : {"kvcache_prefix_hit_tokens_total{tier=\"host\"} 4\n",
             "kvcache_prefix_hit_tokens_total{tier=\"disk\"} 16\n", "kvcache_offloaded_pages_total 7\n",
             "kvcache_tenant_prefix_hit_tokens_total{tenant=\"61\",tier=\"disk\"} 0\n",
             "# TYPE kvcache_restored_pages_total counter\n"})
    {
        EXPECT_NE(text.find(line), std::string::npos) << line;
    }
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { toPrometheusText(counters, "9kv"); }, {"prefix", "\"9kv\"", "[a-zA-Z_:]"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { toPrometheusText(counters, ""); }, {"prefix"}));
}

} // namespace
} // namespace kvcache::rt
