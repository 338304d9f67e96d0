// kvcache-plan's plans against sizes worked out by hand: pages, groups, windows, budgets.
#include "test_support.h"

#include "kvcache/core/errors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::plan
{
namespace
{

using namespace test_support;

// ---- plans, against sizes worked out by hand ----

TEST(MakePlan, DefaultModel)
{
    Plan const plan = planFor({"--budget", "40GiB"});
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kHALF);
    EXPECT_EQ(plan.layout.capPadded, 8192);  // 8192 is already a multiple of 128
    EXPECT_EQ(plan.layout.pagesPerSlot, 64); // 8192 / 128
    EXPECT_EQ(plan.layout.minPages, 512);    // 8 sequences * 64 pages
    EXPECT_EQ(plan.layout.numPages, 512);
    // 2 * 512 pages * 128 tokens * 8 heads * 128 dims * 2 bytes = 268,435,456 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(32, 268435456));
    EXPECT_EQ(plan.layout.cacheBytes, 8589934592); // 32 * 268,435,456 = 8 GiB
    // 32 layers * 2 halves * 128 tokens * 8 heads * 128 dims * 2 bytes = 16,777,216 per page id.
    EXPECT_EQ(plan.layout.bytesPerPage, 16777216);
    EXPECT_EQ(plan.budgetPages, 2560); // 42,949,672,960 / 16,777,216 = 2560 exactly
}

TEST(MakePlan, LlamaFixtureAtLongContext)
{
    Plan const plan = planFor(
        {"--config", modelPath("llama-3.1-8b-like.json"), "--batch", "2", "--seq-len", "131072", "--budget", "80GB"});
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kBF16); // torch_dtype
    EXPECT_EQ(plan.layout.minPages, 2048);                   // 2 * 131072 / 128
    // 2 * 2048 pages * 128 tokens * 8 heads * 128 dims * 2 bytes = 1,073,741,824 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(32, 1073741824));
    EXPECT_EQ(plan.layout.cacheBytes, 34359738368); // 32 GiB
    // 80,000,000,000 / 16,777,216 = 4768.37: 4768 * 16,777,216 = 79,993,765,888 fits, 4769 pages do not.
    EXPECT_EQ(plan.budgetPages, 4768);
}

TEST(MakePlan, OpenElmFixtureWithPerLayerHeads)
{
    Plan const plan =
        planFor({"--config", modelPath("openelm-like.json"), "--batch", "1", "--seq-len", "2048", "--budget", "1GiB"});
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kFLOAT); // torch_dtype float32: 4 bytes
    EXPECT_EQ(plan.layout.minPages, 16);                      // 1 * 2048 / 128
    // 2 * 16 pages * 128 tokens * H * 64 dims * 4 bytes = H * 1,048,576.
    EXPECT_EQ(layerBytes(plan), (std::vector<int64_t>{3145728, 3145728, 4194304, 4194304, 5242880, 5242880}));
    EXPECT_EQ(plan.layout.cacheBytes, 25165824); // (3+3+4+4+5+5) * 1,048,576
    // Per page id: 2 * 128 tokens * 64 dims * 4 bytes * (3+3+4+4+5+5) heads = 65,536 * 24 = 1,572,864.
    EXPECT_EQ(plan.layout.bytesPerPage, 1572864);
    // 1,073,741,824 / 1,572,864 = 682.67: 682 pages.
    EXPECT_EQ(plan.budgetPages, 682);
}

TEST(MakePlan, QwenNextFixtureCountsOnlyAttentionLayers)
{
    Plan const plan = planFor({"--config", modelPath("qwen3-next-like.json"), "--budget", "10GiB"});
    EXPECT_EQ(plan.config.numAttentionLayers, 12);
    // 2 * 512 pages * 128 tokens * 2 heads * 256 dims * 2 bytes = 134,217,728 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(12, 134217728));
    EXPECT_EQ(plan.layout.cacheBytes, 1610612736); // 12 * 134,217,728 = 1.5 GiB
    // 12 layers * 2 * 128 * 2 * 256 * 2 bytes = 3,145,728 per page id.
    EXPECT_EQ(plan.layout.bytesPerPage, 3145728);
    // The 36 gated delta net layers keep 8 slots of 77,266,944 bytes (see test_state_layers_plan.cpp) =
    // 618,135,552 bytes, paid first: (10,737,418,240 - 618,135,552) / 3,145,728 = 3216.9: 3216 pages.
    EXPECT_EQ(plan.layout.stateBytes, 618135552);
    EXPECT_EQ(plan.budgetPages, 3216);
}

TEST(MakePlan, JambaFixtureWithRetainedPagesAndSmallPages)
{
    Plan const plan = planFor({"--config", modelPath("jamba-like.json"), "--seq-len", "4000", "--page-size", "64",
        "--pages", "1000", "--dtype", "fp8_e4m3", "--budget", "500MiB"});
    EXPECT_EQ(plan.layout.pagesPerSlot, 63); // ceil(4000 / 64) = 62.5 rounded up
    EXPECT_EQ(plan.layout.capPadded, 4032);  // 63 * 64
    EXPECT_EQ(plan.layout.minPages, 504);    // 8 * 63
    EXPECT_EQ(plan.layout.numPages, 1000);
    // 2 * 1000 pages * 64 tokens * 8 heads * 128 dims * 1 byte = 131,072,000 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(4, 131072000));
    EXPECT_EQ(plan.layout.cacheBytes, 524288000); // 4 * 131,072,000 = 500 MiB
    // 4 layers * 2 * 64 * 8 * 128 * 1 byte = 524,288 per page id. The 28 Mamba layers (d_inner 2 * 4096 = 8192) keep
    // conv [8192, 3] bfloat16 (49,152 bytes) and SSM [8192, 16] float32 (524,288 bytes) a sequence: 8 slots x 28 x
    // 573,440 = 128,450,560 bytes, paid first: (524,288,000 - 128,450,560) / 524,288 = 755 pages.
    EXPECT_EQ(plan.layout.stateBytes, 128450560);
    EXPECT_EQ(plan.budgetPages, 755);
}

TEST(MakePlan, LayerHeadsList)
{
    Plan const plan =
        planFor({"--layer-heads", "8x128,8x128,2x64", "--dtype", "float32", "--batch", "2", "--seq-len", "300"});
    EXPECT_EQ(plan.layout.capPadded, 384); // 300 rounded up to 3 pages of 128
    EXPECT_EQ(plan.layout.minPages, 6);    // 2 * 3
    // 2 * 6 * 128 * 8 * 128 * 4 = 6,291,456; 2 * 6 * 128 * 2 * 64 * 4 = 786,432.
    EXPECT_EQ(layerBytes(plan), (std::vector<int64_t>{6291456, 6291456, 786432}));
    EXPECT_EQ(plan.layout.cacheBytes, 13369344); // 2 * 6,291,456 + 786,432
    // 2 * (2 * 128 * 8 * 128 * 4) + 2 * 128 * 2 * 64 * 4 = 2 * 1,048,576 + 131,072.
    EXPECT_EQ(plan.layout.bytesPerPage, 2228224);
    EXPECT_EQ(plan.budgetPages, 0); // no budget given
}

TEST(MakePlan, UniformFlags)
{
    Plan const big = planFor({"--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--batch", "1", "--seq-len",
        "131072", "--dtype", "fp8_e4m3"});
    // 2 * 1024 pages * 128 tokens * 8 * 128 * 1 byte = 268,435,456; 80 layers = 21,474,836,480 (20 GiB).
    EXPECT_EQ(layerBytes(big), std::vector<int64_t>(80, 268435456));
    EXPECT_EQ(big.layout.cacheBytes, 21474836480);

    // Only --kv-heads: the built-in's 32 layers and head_dim 128 stay.
    Plan const narrow = planFor({"--kv-heads", "4"});
    // 2 * 512 * 128 * 4 * 128 * 2 bytes = 134,217,728.
    EXPECT_EQ(layerBytes(narrow), std::vector<int64_t>(32, 134217728));
}

TEST(MakePlan, DtypeFromConfigNeedsAKnownName)
{
    ModelDescription model = modelFromLayers("m", {{2, 64}});
    model.dataTypeName = "float8_e4m3fn";
    EXPECT_THROW(makePlan(model, PlanOptions{}), ModelConfigError);
    PlanOptions options;
    options.dataType = rt::DataType::kINT8;
    EXPECT_EQ(makePlan(model, options).config.kvCacheType, rt::DataType::kINT8);
}

TEST(MakePlan, KVFormatsPlanTheIssuesExampleToTheByte)
{
    // 32 layers of 8 heads of D = 128, batch 64 x 8192 tokens: 64 * 8192 / 128 = 4096 pages a half; a layer holds
    // 2 halves * 4096 pages * 128 tokens * 8 heads = 2^23 (token, head, half) entries, the cache 32 * 2^23 = 2^28.
    // Bytes an entry: fp16 2D = 256; fp8 D = 128; fp8 per token-head D + 4 = 132; NVFP4 D/2 + D/16 = 64 + 8 = 72.
    struct Expected
    {
        char const* name;
        rt::DataType storage;
        rt::KVQuantization quantization;
        int64_t entryBytes;
        int64_t entryScaleBytes; //!< of entryBytes: 4 (float32) per token-head, D/16 = 8 for NVFP4, else 0
    };
    Expected const expected[] = {
        {"fp16", rt::DataType::kHALF, rt::KVQuantization::kNONE, 256, 0},
        {"bf16", rt::DataType::kBF16, rt::KVQuantization::kNONE, 256, 0},
        {"fp8", rt::DataType::kFP8_E4M3, rt::KVQuantization::kFP8_PER_TENSOR, 128, 0},
        {"fp8-token-head", rt::DataType::kFP8_E4M3, rt::KVQuantization::kFP8_PER_TOKEN_HEAD, 132, 4},
        {"nvfp4", rt::DataType::kUINT8, rt::KVQuantization::kNVFP4, 72, 8},
    };
    int64_t const entriesPerLayer = int64_t{2} * 4096 * 128 * 8;
    for (Expected const& format : expected)
    {
        Plan const plan = planFor({"--kv-dtype", format.name, "--batch", "64", "--seq-len", "8192"});
        EXPECT_EQ(plan.config.kvCacheType, format.storage) << format.name;
        EXPECT_EQ(plan.config.quantization, format.quantization) << format.name;
        ASSERT_EQ(plan.layout.layers.size(), 32u);
        EXPECT_EQ(plan.layout.numPages, 4096) << format.name;
        for (rt::KVLayerLayout const& layer : plan.layout.layers)
        {
            EXPECT_EQ(layer.layerBytes + layer.scaleBytes, entriesPerLayer * format.entryBytes) << format.name;
            EXPECT_EQ(layer.scaleBytes, entriesPerLayer * format.entryScaleBytes) << format.name;
        }
        EXPECT_EQ(plan.layout.cacheBytes, 32 * entriesPerLayer * format.entryBytes) << format.name;
    }
    // The same figures written out: 64 GiB, 32 GiB, 2^28 * 132 and 2^28 * 72 (18 GiB).
    EXPECT_EQ(planFor({"--kv-dtype", "fp16", "--batch", "64"}).layout.cacheBytes, 68719476736);
    EXPECT_EQ(planFor({"--kv-dtype", "fp8", "--batch", "64"}).layout.cacheBytes, 34359738368);
    EXPECT_EQ(planFor({"--kv-dtype", "fp8-token-head", "--batch", "64"}).layout.cacheBytes, 35433480192);
    EXPECT_EQ(planFor({"--kv-dtype", "nvfp4", "--batch", "64"}).layout.cacheBytes, 19327352832);
}

TEST(MakePlan, KVFormatBudgetCountsScaleBytes)
{
    // fp8 per token-head, built-in model: a page id is 32 layers * 2 halves * 128 tokens * 8 heads * 132 bytes =
    // 8,650,752 bytes; 10 GiB = 10,737,418,240 / 8,650,752 = 1,241.2, so 1,241 pages (fp8 alone would fit 1,280).
    Plan const plan = planFor({"--kv-dtype", "fp8-token-head", "--budget", "10GiB"});
    EXPECT_EQ(plan.layout.bytesPerPage, 8650752);
    EXPECT_EQ(plan.budgetPages, 1241);
}

TEST(MakePlan, LibraryRefusesAFormatTheModelCannotStore)
{
    // NVFP4 needs every head dimension a multiple of 16: 8 x 120 is refused by the library's validation.
    EXPECT_THROW(planFor({"--kv-dtype", "nvfp4", "--head-dim", "120"}), rt::InvalidConfigError);
    ProgramResult const result = runProgram({"--kv-dtype", "nvfp4", "--head-dim", "120"});
    EXPECT_EQ(result.status, kEXIT_BAD_INPUT);
    EXPECT_NE(result.err.find("headDim"), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("120"), std::string::npos) << result.err;
}

TEST(MakePlan, LibraryRejectsBadCacheConfigs)
{
    EXPECT_THROW(planFor({"--page-size", "100"}), rt::InvalidConfigError); // not a power of two
    EXPECT_THROW(planFor({"--pages", "511"}), rt::InvalidConfigError);     // below the minimum 8 * 64 = 512
}

// ---- windowed, chunked and latent plans at batch 8, 8192 tokens, 128 tokens per page, 2048 tokens a step ----
// A windowed layer keeps min(ceil(8192 / 128), ceil((W - 1 + 2048) / 128) + 1) = min(64, ...) pages a sequence.

TEST(MakePlan, GptOssWindowKeepsEighteenPages)
{
    Plan const plan = steppedPlan("gpt-oss-20b.json");
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kBF16);
    EXPECT_EQ(plan.layout.maxTokensPerStep, 2048);
    // Window 128: ceil((127 + 2048) / 128) + 1 = ceil(16.99) + 1 = 18 pages, 8 * 18 = 144; full: 64 and 512.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{0, 128}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {18, 144}}));
    EXPECT_EQ(plan.layout.groups[0].layers, (std::vector<int32_t>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
    EXPECT_EQ(plan.layout.groups[1].slotTokens, 2304); // 18 * 128
    // Per page and layer: 2 * 128 tokens * 8 heads * 64 dims * 2 bytes = 262,144.
    // Full layers 512 * 262,144 = 134,217,728; windowed 144 * 262,144 = 37,748,736.
    EXPECT_EQ(layerBytes(plan), alternating<int64_t>(24, 37748736, 134217728));
    EXPECT_EQ(plan.layout.cacheBytes, 2063597568); // 12 * 134,217,728 + 12 * 37,748,736
    EXPECT_EQ(plan.fullLengthBytes, 3221225472);   // 24 * 134,217,728 = 3 GiB
    EXPECT_FALSE(plan.stepSuggestion.has_value()); // --step-tokens was given
}

TEST(MakePlan, Gemma2WindowKeepsFortyNinePages)
{
    Plan const plan = steppedPlan("gemma-2-9b-it.json");
    // Window 4096: ceil((4095 + 2048) / 128) + 1 = ceil(47.99) + 1 = 49 pages, 8 * 49 = 392.
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {49, 392}}));
    // Per page and layer: 2 * 128 * 8 heads * 256 dims * 2 bytes = 1,048,576.
    // Full 512 * 1,048,576 = 536,870,912; windowed 392 * 1,048,576 = 411,041,792.
    EXPECT_EQ(layerBytes(plan), alternating<int64_t>(42, 411041792, 536870912));
    EXPECT_EQ(plan.layout.cacheBytes, 19906166784); // 21 * (536,870,912 + 411,041,792)
    EXPECT_EQ(plan.fullLengthBytes, 22548578304);   // 42 * 536,870,912 = 21 GiB
}

TEST(MakePlan, Gemma3WindowKeepsTwentyFivePages)
{
    Plan const plan = steppedPlan("gemma-3-27b-it.json");
    // Window 1024: ceil((1023 + 2048) / 128) + 1 = ceil(23.99) + 1 = 25 pages, 8 * 25 = 200.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{0, 1024}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {25, 200}}));
    EXPECT_EQ(plan.layout.groups[0].layers, (std::vector<int32_t>{5, 11, 17, 23, 29, 35, 41, 47, 53, 59}));
    // Per page and layer: 2 * 128 * 16 heads * 128 dims * 2 bytes = 1,048,576.
    // 10 full layers * 512 MiB = 5,368,709,120; 52 windowed * 200 MiB = 10,905,190,400.
    EXPECT_EQ(plan.layout.groups[0].cacheBytes, 5368709120);
    EXPECT_EQ(plan.layout.groups[1].cacheBytes, 10905190400);
    EXPECT_EQ(plan.layout.cacheBytes, 16273899520); // 15,520 MiB
    EXPECT_EQ(plan.fullLengthBytes, 33285996544);   // 62 * 512 MiB = 31 GiB
}

TEST(MakePlan, MistralIsOneWindowedGroup)
{
    Plan const plan = steppedPlan("mistral-7b-v0.1.json");
    // Every layer has window 4096: one group of 49 pages a sequence, and capPadded is its slotTokens.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{4096}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{49, 392}}));
    EXPECT_EQ(plan.layout.capPadded, 6272); // 49 * 128
    // 2 * 392 pages * 128 * 8 heads * 128 dims * 2 bytes = 205,520,896 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(32, 205520896));
    EXPECT_EQ(plan.layout.cacheBytes, 6576668672); // 32 * 205,520,896
    EXPECT_EQ(plan.fullLengthBytes, 8589934592);   // 32 * 2 * 512 * 128 * 8 * 128 * 2 = 8 GiB

    // One group: --pages still works, and the budget counts pages.
    Plan const pages = planFor(
        {"--config", modelPath("mistral-7b-v0.1.json"), "--step-tokens", "2048", "--pages", "400", "--budget", "1GiB"});
    EXPECT_EQ(pages.layout.numPages, 400);
    EXPECT_EQ(pages.fullLengthBytes, 8589934592); // 400 pages are below the full-length minimum 512
    // Per page id: 32 layers * 2 * 128 * 8 * 128 * 2 = 16,777,216; 1 GiB / 16 MiB = 64 pages.
    EXPECT_EQ(pages.budgetPages, 64);
    EXPECT_FALSE(pages.budgetSplit.has_value());
}

TEST(MakePlan, QwenKeepsFullCaches)
{
    Plan const plan = steppedPlan("qwen2.5-7b.json");
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}}));
    // 2 * 512 * 128 * 4 heads * 128 dims * 2 bytes = 134,217,728 per layer.
    EXPECT_EQ(plan.layout.cacheBytes, 3758096384); // 28 * 134,217,728 = 3.5 GiB
    EXPECT_EQ(plan.fullLengthBytes, plan.layout.cacheBytes);
}

TEST(MakePlan, DeepSeekPlansTheLatentNotTheDecompressedHeads)
{
    Plan const plan = steppedPlan("deepseek-v3.json");
    for (rt::KVLayerLayout const& layer : plan.layout.layers)
    {
        EXPECT_EQ(layer.numHalves, 1); // K only
    }
    // 512 pages * 128 tokens * 576 values * 2 bytes = 75,497,472 per layer; 61 layers = 4,605,345,792 (4.29 GiB).
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(61, 75497472));
    EXPECT_EQ(plan.layout.cacheBytes, 4605345792);
    EXPECT_EQ(plan.layout.bytesPerPage, 8994816); // 61 * 128 * 576 * 2

    // What the planner used to read: 128 KV heads x 56 (7168 / 128), K and V: 61 * 2 * 512 * 128 * 128 * 56 * 2
    // = 114,621,939,712 bytes (106.75 GiB), about 25 times the real cache.
    PlanOptions options = parseArguments({"--dtype", "bfloat16"});
    Plan const old = makePlan(modelFromLayers("old", std::vector<rt::KVLayerConfig>(61, {128, 56})), options);
    EXPECT_EQ(old.layout.cacheBytes, 114621939712);
    EXPECT_EQ(old.layout.cacheBytes / plan.layout.cacheBytes, 24); // 24.9
}

TEST(MakePlan, Llama4ChunksCoverTheWholeSequenceAt8192)
{
    Plan const plan = steppedPlan("llama-4-scout-17b-16e.json");
    // Chunk 8192 as a window: min(64, ceil((8191 + 2048) / 128) + 1) = min(64, 81) = 64 pages: no saving here.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{0, 8192}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {64, 512}}));
    // 48 layers * 2 * 512 * 128 * 8 * 128 * 2 bytes = 48 * 268,435,456 = 12 GiB either way.
    EXPECT_EQ(plan.layout.cacheBytes, 12884901888);
    EXPECT_EQ(plan.fullLengthBytes, 12884901888);

    Plan const longer =
        planFor({"--config", modelPath("llama-4-scout-17b-16e.json"), "--seq-len", "65536", "--step-tokens", "2048"});
    // Full layers: 65536 / 128 = 512 pages, 8 * 512 = 4096; chunked: min(512, 81) = 81, 8 * 81 = 648.
    EXPECT_EQ(groupPages(longer), (std::vector<std::pair<int32_t, int32_t>>{{512, 4096}, {81, 648}}));
    // Per page and layer 2 * 128 * 8 * 128 * 2 = 524,288: 12 * 4096 * 524,288 + 36 * 648 * 524,288.
    EXPECT_EQ(longer.layout.cacheBytes, 38000394240); // 25,769,803,776 + 12,230,590,464
    EXPECT_EQ(longer.fullLengthBytes, 103079215104);  // 48 * 4096 * 524,288 = 96 GiB
}

TEST(MakePlan, StepZeroKeepsFullCachesAndSuggests2048)
{
    Plan const plan = planFor({"--config", modelPath("gpt-oss-20b.json")});
    EXPECT_EQ(plan.layout.maxTokensPerStep, 8192); // 0 means the sequence length
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {64, 512}}));
    EXPECT_EQ(plan.layout.cacheBytes, 3221225472);
    ASSERT_TRUE(plan.stepSuggestion.has_value());
    EXPECT_EQ(plan.stepSuggestion->stepTokens, 2048);
    EXPECT_EQ(plan.stepSuggestion->cacheBytes, 2063597568); // GptOssWindowKeepsEighteenPages
    EXPECT_EQ(plan.stepSuggestion->currentBytes, 3221225472);

    // Shorter sequences than 2048: the suggestion is a whole sequence a step, which saves nothing.
    Plan const shortPlan = planFor({"--config", modelPath("gpt-oss-20b.json"), "--seq-len", "1000"});
    ASSERT_TRUE(shortPlan.stepSuggestion.has_value());
    EXPECT_EQ(shortPlan.stepSuggestion->stepTokens, 1000);
    EXPECT_EQ(shortPlan.stepSuggestion->cacheBytes, shortPlan.stepSuggestion->currentBytes);

    EXPECT_FALSE(planFor({"--config", modelPath("qwen2.5-7b.json")}).stepSuggestion.has_value()); // no windows
}

TEST(MakePlan, BudgetIsSplitAcrossGroups)
{
    Plan const plan =
        planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "2048", "--budget", "10GiB"});
    ASSERT_TRUE(plan.budgetSplit.has_value());
    EXPECT_EQ(plan.budgetPages, 0);
    // One full-length sequence: 64 pages of group 0 and 18 of group 1, each page 12 layers * 262,144 = 3,145,728
    // bytes: 82 * 3,145,728 = 257,949,696. 10,737,418,240 / 257,949,696 = 41.6, so 41 sequences.
    EXPECT_EQ(plan.budgetSplit->sequences, 41);
    EXPECT_EQ(plan.budgetSplit->numPagesPerGroup, (std::vector<int64_t>{2624, 738})); // 41 * 64, 41 * 18
    EXPECT_EQ(plan.budgetSplit->bytes, 10575937536);                                  // 41 * 257,949,696
}

TEST(MakePlan, PagesWithSeveralGroupsAndStepsOverTheSequenceAreUsageErrors)
{
    try
    {
        planFor({"--config", modelPath("gemma-3-27b-it.json"), "--pages", "1000"});
        ADD_FAILURE() << "accepted --pages with two page groups";
    }
    catch (UsageError const& error)
    {
        std::string const message = error.what();
        EXPECT_NE(message.find("--pages 1000"), std::string::npos) << message;
        EXPECT_NE(message.find("2 page groups"), std::string::npos) << message;
        EXPECT_NE(message.find("--budget"), std::string::npos) << message;
    }
    // A step longer than the sequence.
    EXPECT_THROW(planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "9000"}), UsageError);
}

} // namespace
} // namespace kvcache::plan
