// Randomised host test of the page lifecycle (kvcache/paging/page_manager.h) against the independent model
// (tests/support/page_manager_model.h): 1,430,000 operations over seven runs (one page group, a full plus windowed pair
// of groups, each with SHA-256 and XXH3-128, and a hybrid cache of a full and two windowed groups whose invariants are
// checked after every operation; then one group and the hybrid cache again with setRetention() calls), invalid calls
// and out-of-pages steps included, from fixed seeds. After every operation the outcome (result or exception type),
// every live sequence's page entries and length, counts() (anchored pages included), the copies the steps returned and
// stats() of every group, and the eviction callback's calls are compared with the model, which keeps a hybrid cache's
// cuts its own way, and so is every page's retention priority; checkInvariants() runs every RunSpec::invariantPeriod
// operations (it is linear and allocates). Pools are small so that steps run out of pages and windowed groups drop
// cuts, and prompts share a few prefixes so that adoptPrefix() finds them. Some operations adopt a run of whole pages
// through detail::PageManagerInternal::adoptRun (the tiered cache's admission), which the model predicts page for page,
// fresh pages included. The driver of a run is tests/support/page_manager_random_run.h.
//
// KVCACHE_RANDOM_OPERATIONS=<n> sets the operations of each run (default 260,000): the sanitizer build (test preset
// "asan") runs fewer, since every operation costs many times more there. A value that is not a positive integer
// fails the test rather than falling back to the default.

#include "kvcache/paging/page_hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "support/config_builder.h"
#include "support/page_manager_random_run.h"

namespace kvcache::rt
{
namespace
{

using test::random_run::kINVARIANT_PERIOD;
using test::random_run::kMAX_LENGTH;
using test::random_run::kTOKENS_PER_PAGE;
using test::random_run::operationsPerRun;
using test::random_run::RandomRun;
using test::random_run::RunSpec;

//! One group of 16 pages (two slots of 8), 8 tokens a step.
KVCacheConfig oneGroup()
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(2)
        .maxSequenceLength(kMAX_LENGTH)
        .tokensPerPage(kTOKENS_PER_PAGE)
        .maxTokensPerStep(8);
}

//! Full attention (16 pages) and a window of 6 tokens (4 pages a sequence, 8 pages), 4 tokens a step.
KVCacheConfig fullAndWindowed()
{
    return test::ConfigBuilder({{1, 8, 6}, {1, 8}})
        .maxBatchSize(2)
        .maxSequenceLength(kMAX_LENGTH)
        .tokensPerPage(kTOKENS_PER_PAGE)
        .maxTokensPerStep(4);
}

//! Full attention (16 pages) and windows of 6 and 10 tokens (4 and 5 pages a sequence, 8 and 10 pages), 4 tokens a
//! step: a hybrid cache whose cuts span two windowed groups.
KVCacheConfig fullAndTwoWindows()
{
    return test::ConfigBuilder({{1, 8, 6}, {1, 8}, {1, 8, 10}})
        .maxBatchSize(2)
        .maxSequenceLength(kMAX_LENGTH)
        .tokensPerPage(kTOKENS_PER_PAGE)
        .maxTokensPerStep(4);
}

class PageManagerRandom : public ::testing::TestWithParam<RunSpec>
{
};

TEST_P(PageManagerRandom, MatchesTheModel)
{
    int64_t const operations = operationsPerRun();
    ASSERT_GT(operations, 0) << "KVCACHE_RANDOM_OPERATIONS is '" << std::getenv("KVCACHE_RANDOM_OPERATIONS")
                             << "'; it must be a positive integer (operations of each run)";
    RandomRun run(GetParam());
    std::string const failure = run.run(std::max<int64_t>(1, operations / GetParam().operationsDivisor));
    EXPECT_EQ(failure, "") << "reproduce with this run's fixed seed " << GetParam().seed;
    for (auto const& [outcome, count] : run.tally())
    {
        std::cout << "  " << outcome << ": " << count << "\n";
    }
    if (failure.empty())
    {
        // A run that never reached these would test less than it claims.
        EXPECT_GT(run.tally().count("adoptPrefix hits"), 0u);
        EXPECT_GT(run.tally().count("adoptRun runs"), 0u);
        EXPECT_GT(run.tally().count("adoptRun fresh pages"), 0u);
        EXPECT_GT(run.tally().count("adoptRun out of pages"), 0u);
        EXPECT_GT(run.tally().count("evictions"), 0u);
        EXPECT_GT(run.tally().count("copies cleared"), 0u);
        EXPECT_GT(run.tally().count("OutOfMemoryError"), 0u);
        EXPECT_GT(run.tally().count("InvalidArgumentError"), 0u);
        EXPECT_GT(run.tally().count("OutOfRangeError"), 0u);
        if (GetParam().retentionPercent > 0)
        {
            EXPECT_GT(run.tally().count("retention raised"), 0u);
            EXPECT_GT(run.tally().count("retention raised for a time"), 0u);
            EXPECT_GT(run.tally().at("cached pages moved at a duration's end"), 0);
            EXPECT_GT(run.tally().count("cached pages of another priority"), 0u);
        }
        if (GetParam().config.layerConfigs.size() > 1)
        {
            // Hybrid: cuts were made and kept window pages past their last holder.
            EXPECT_GT(run.tally().count("anchored cached pages"), 0u);
            EXPECT_GT(run.tally().at("anchored cached pages"), 0);
            EXPECT_GT(run.tally().at("cuts dropped for pages"), 0);
            EXPECT_GT(run.tally().at("cuts dropped with their page"), 0);
        }
    }
}

//! Returns a test name for run `index` of the list below.
std::string runName(::testing::TestParamInfo<RunSpec> const& run)
{
    std::string name;
    for (char const* c = run.param.name; *c != '\0'; ++c)
    {
        name += std::isalnum(static_cast<unsigned char>(*c)) != 0 ? *c : '_';
    }
    return name;
}

INSTANTIATE_TEST_SUITE_P(Runs, PageManagerRandom,
    ::testing::Values(RunSpec{"one group SHA256", oneGroup(), PageHashAlgorithm::kSHA256, 20240601u},
        RunSpec{"one group XXH3", oneGroup(), PageHashAlgorithm::kXXH3_128, 7u},
        RunSpec{"full and windowed SHA256", fullAndWindowed(), PageHashAlgorithm::kSHA256, 99991u},
        RunSpec{"full and windowed XXH3", fullAndWindowed(), PageHashAlgorithm::kXXH3_128, 31337u},
        RunSpec{"full and two windows, invariants every operation", fullAndTwoWindows(), PageHashAlgorithm::kXXH3_128,
            4242u, 1, 2},
        RunSpec{"one group with retention", oneGroup(), PageHashAlgorithm::kXXH3_128, 5150u, kINVARIANT_PERIOD, 2, 8},
        RunSpec{
            "full and two windows with retention", fullAndTwoWindows(), PageHashAlgorithm::kXXH3_128, 8088u, 1, 2, 8}),
    runName);

} // namespace
} // namespace kvcache::rt
