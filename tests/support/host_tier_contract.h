#pragma once

// The host tier's contract suite: the cache variants every contract test runs over (each element type, every
// quantization in every page group of a hybrid cache, and caches with state layers) and the fixture that builds a
// variant's cache, filled with random bytes beside its independent models (support/page_op_reference.h for pages,
// support/host_state_reference.h for state slots).

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/tiers/host_tier.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/host_page_reference.h"
#include "support/host_state_reference.h"
#include "support/page_op_reference.h"
#include "support/scaled_configs.h"
#include "support/state_configs.h"

namespace kvcache::test
{

//! A cache and the page group a tier holds pages of.
struct HostTierVariant
{
    std::string name;
    rt::KVCacheConfig config;
    int32_t group = 0;
    //! Host states a tier of the variant holds: above 0 exactly for a cache with state layers.
    int64_t numHostStates = 0;
};

inline void PrintTo(HostTierVariant const& variant, std::ostream* out)
{
    *out << variant.name;
}

//! Two KV layers around a latent one, of different page sizes, in one page group: 2 slots of 256 tokens and 24 pages
//! above the minimum.
inline rt::KVCacheConfig mixedLayerConfig(rt::DataType type, int32_t tokensPerPage)
{
    return ConfigBuilder({{2, 64}, {1, 96, 0, rt::KVLayerKind::kLATENT}, {4, 32}})
        .maxBatchSize(2)
        .maxSequenceLength(256)
        .tokensPerPage(tokensPerPage)
        .dataType(type)
        .numPages(2 * 256 / tokensPerPage + 24);
}

//! Every variant the contract runs over. Element types: float32, bfloat16, FP8 E5M2, int8 and uint8 unquantized on
//! mixedLayerConfig(), pages of 16 and 128 tokens. Quantizations: each of kEVERY_FORMAT (float16 and FP8 E4M3
//! unquantized, FP8 per tensor, FP8 per token-head, NVFP4 with its data and scale pools) in each page group of
//! scaledConfig(): full attention beside windows of 16 and 48, latent layers in each. State layers: a full-attention
//! cache, and the windowed group of a hybrid one.
inline std::vector<HostTierVariant> hostTierVariants()
{
    std::vector<HostTierVariant> variants;
    struct Plain
    {
        rt::DataType type;
        int32_t tokensPerPage;
    };
    for (Plain const plain : {Plain{rt::DataType::kFLOAT, 128}, Plain{rt::DataType::kBF16, 128},
             Plain{rt::DataType::kFP8_E5M2, 16}, Plain{rt::DataType::kINT8, 128}, Plain{rt::DataType::kUINT8, 16}})
    {
        variants.push_back({std::string(rt::dataTypeName(plain.type)) + "_" + std::to_string(plain.tokensPerPage),
            mixedLayerConfig(plain.type, plain.tokensPerPage)});
    }
    char const* const groupNames[] = {"full", "window16", "window48"};
    for (ScaledFormat const format : kEVERY_FORMAT)
    {
        for (int32_t group = 0; group < 3; ++group)
        {
            variants.push_back({std::string(rt::kvQuantizationName(format.quantization)) + "_"
                    + std::string(rt::dataTypeName(format.storage)) + "_" + groupNames[group],
                scaledConfig(format), group});
        }
    }
    variants.push_back({"states_float16", stateLayerConfig(), 0, 3});
    variants.push_back({"states_bfloat16_window32", windowedStateLayerConfig(), 1, 3});
    return variants;
}

//! Returns the variants whose caches have state layers.
inline std::vector<HostTierVariant> hostTierStateVariants()
{
    std::vector<HostTierVariant> variants;
    for (HostTierVariant const& variant : hostTierVariants())
    {
        if (variant.numHostStates > 0)
        {
            variants.push_back(variant);
        }
    }
    return variants;
}

//! Names a variant's test instance after it.
inline std::string variantName(::testing::TestParamInfo<HostTierVariant> const& info)
{
    return info.param.name;
}

//! A config a tier of `variant` must refuse, and how the refusal names the difference.
struct OtherCache
{
    rt::KVCacheConfig config;
    std::string field; //!< the first field of PageGeometry that differs ("quantization", "dataType")
    std::string cacheValue;
    std::string tierValue;
};

//! Returns `variant`'s config with another page geometry: unquantized (same storage) for a quantized cache, else
//! float32 (float16 for a float32 cache).
inline OtherCache otherGeometry(HostTierVariant const& variant)
{
    OtherCache other{variant.config, "", "", ""};
    rt::KVCacheConfig& config = other.config;
    if (config.quantization != rt::KVQuantization::kNONE)
    {
        other.field = "quantization";
        other.tierValue = rt::kvQuantizationName(config.quantization);
        config.quantization = rt::KVQuantization::kNONE;
        other.cacheValue = rt::kvQuantizationName(config.quantization);
    }
    else
    {
        other.field = "dataType";
        other.tierValue = rt::dataTypeName(config.kvCacheType);
        config.kvCacheType = config.kvCacheType == rt::DataType::kFLOAT ? rt::DataType::kHALF : rt::DataType::kFLOAT;
        other.cacheValue = rt::dataTypeName(config.kvCacheType);
    }
    return other;
}

//! Returns `variant`'s config with one page more in the tier's group (the same geometry, other page ids).
inline rt::KVCacheConfig otherPageCount(HostTierVariant const& variant)
{
    rt::KVCacheConfig config = variant.config;
    LayoutModel const model = modelLayout(config);
    config.numPages = 0;
    config.numPagesPerGroup.clear();
    for (ModelGroup const& group : model.groups)
    {
        config.numPagesPerGroup.push_back(static_cast<int32_t>(group.numPages));
    }
    ++config.numPagesPerGroup.at(static_cast<size_t>(variant.group));
    return config;
}

//! A list a transfer must refuse before it enqueues anything, and what the refusal names.
template <typename Entry>
struct RefusedList
{
    std::vector<Entry> entries;
    bool outOfRange; //!< OutOfRangeError (an id outside its range), else InvalidArgumentError
    std::vector<std::string> named;
};

//! Expects `transfer(list.entries)` to throw each list's error with a message naming `what` and the list's words.
template <typename Entry, typename Transfer>
void expectListsRefused(std::string const& what, std::vector<RefusedList<Entry>> const& lists, Transfer&& transfer)
{
    for (RefusedList<Entry> const& list : lists)
    {
        std::vector<std::string> named = list.named;
        named.push_back(what);
        auto const call = [&] { transfer(list.entries); };
        EXPECT_TRUE(list.outOfRange ? throwsNaming<rt::OutOfRangeError>(call, named)
                                    : throwsNaming<rt::InvalidArgumentError>(call, named))
            << "the list of " << list.entries.size() << " entries naming " << list.named.front();
    }
}

//! What host states are poisoned with before a transfer or a load writes them, and state slots before an onboard.
inline constexpr uint8_t kHOST_STATE_POISON = 0xA5;

//! Returns the bytes of host state `hostState` of `tier`, after the tier's transfers touching it.
inline std::vector<uint8_t> hostStateContents(rt::HostTier& tier, int32_t hostState)
{
    auto const* data = static_cast<uint8_t const*>(tier.hostStateData(hostState));
    return std::vector<uint8_t>(data, data + tier.hostStateBytes());
}

//! Sets every byte of host state `hostState` of `tier` to kHOST_STATE_POISON.
inline void poisonHostState(rt::HostTier& tier, int32_t hostState)
{
    std::memset(tier.hostStateData(hostState), kHOST_STATE_POISON, static_cast<size_t>(tier.hostStateBytes()));
}

//! The contract's fixture: the variant's cache filled with random bytes beside its models.
class HostTierContract : public GpuTest, public ::testing::WithParamInterface<HostTierVariant>
{
protected:
    void SetUp() override
    {
        GpuTest::SetUp();
        if (IsSkipped() || HasFatalFailure())
        {
            return;
        }
        mCut = std::make_unique<CacheUnderTest>(GetParam().config, 17);
        if (GetParam().numHostStates > 0)
        {
            mStates = std::make_unique<HostStateReference>(GetParam().config, mCut->cache(), mCut->stream(), 19);
        }
    }

    //! Returns the variant's cache and its page model.
    CacheUnderTest& cut()
    {
        return *mCut;
    }
    //! Returns the page group the variant's tiers hold.
    int32_t group() const
    {
        return GetParam().group;
    }
    //! Returns true when the variant's cache has state layers.
    bool hasStates() const
    {
        return mStates != nullptr;
    }
    //! Returns the state model (hasStates() only).
    HostStateReference& states()
    {
        return *mStates;
    }
    //! Returns the bytes of one host page by the model: every layer's data and scale pages of the group.
    int64_t modelHostPageBytes()
    {
        return cut().reference().model().groups.at(static_cast<size_t>(group())).bytesPerPage;
    }
    //! Returns the options of a tier of the variant: its host states, and `stagingHostPages` host pages of staging a
    //! direction (0: the default).
    rt::HostTierOptions options(int32_t stagingHostPages = 0)
    {
        rt::HostTierOptions options;
        options.numHostStates = GetParam().numHostStates;
        if (stagingHostPages > 0)
        {
            options.stagingBytes = 2 * int64_t{stagingHostPages} * modelHostPageBytes();
        }
        return options;
    }
    //! Returns a tier of `numHostPages` host pages of the variant's group, each poisoned.
    std::unique_ptr<rt::HostTier> makeTier(int32_t numHostPages, rt::HostTierOptions const& tierOptions)
    {
        auto tier = std::make_unique<rt::HostTier>(cut().cache(), group(), numHostPages, tierOptions);
        tier->waitUntilReady();
        for (int32_t hostPage = 0; hostPage < numHostPages; ++hostPage)
        {
            poisonHostPage(*tier, hostPage);
        }
        return tier;
    }
    //! Returns what a poisoned host page holds.
    std::vector<uint8_t> poisonedHostPage()
    {
        return std::vector<uint8_t>(static_cast<size_t>(modelHostPageBytes()), kHOST_PAGE_POISON);
    }
    //! Checks that `hostPages` of `tier` are still poisoned, and that every byte of the cache (pages, scales and state
    //! slots) is still what the models hold.
    ::testing::AssertionResult nothingChanged(rt::HostTier& tier, std::vector<int32_t> const& hostPages)
    {
        for (int32_t const hostPage : hostPages)
        {
            if (hostPageContents(tier, hostPage) != poisonedHostPage())
            {
                return ::testing::AssertionFailure() << "host page " << hostPage << " was written";
            }
        }
        ::testing::AssertionResult pages = cut().matchesReference();
        if (!pages)
        {
            return pages;
        }
        return hasStates() ? states().matchesReference() : ::testing::AssertionSuccess();
    }

private:
    std::unique_ptr<CacheUnderTest> mCut;
    std::unique_ptr<HostStateReference> mStates;
};

} // namespace kvcache::test
