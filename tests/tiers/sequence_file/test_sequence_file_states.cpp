// Sequence files holding a sequence's state slot, on plain host buffers (no GPU): the state tensors of a layout
// against values worked out by hand, round trips of pages and state, version 2 files (no state) still read, and every
// bad state, written or read, refused before anything is written.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/tiers/sequence_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "support/error_matchers.h"
#include "support/sequence_file_fixture.h"
#include "support/state_configs.h"

namespace kvcache::test
{
namespace
{

namespace fs = std::filesystem;

//! The state of stateLayerConfig() (one KV layer of 2 x 64 float16, 8192 bytes a page): conv 6 * 3 * 2 = 36 bytes,
//! recurrent 2 * 4 * 4 * 4 = 128, ssm 7; 171 in all.
constexpr int64_t kSTATE_BYTES = 36 + 128 + 7;
//! Its header: the fixed 56, one 24-byte layer record, the state tensor count and a reserved int32, three 80-byte
//! state records, the checksum.
constexpr int64_t kHEADER_BYTES = 56 + 24 + 8 + 3 * 80 + 8;
constexpr int64_t kSTATE_RECORDS_AT = 56 + 24 + 8;

class SequenceFileStatesTest : public SequenceFileFixture
{
protected:
    SequenceFileStatesTest()
        : layout(rt::computeLayout(stateLayerConfig()))
        , geometry(rt::pageGeometry(layout, 0))
        , tensors(rt::sequenceStateTensors(layout))
        , pages(randomPages(geometry, 2, 11))
        , state(randomState(12))
    {
    }

    static std::vector<uint8_t> randomState(uint32_t seed)
    {
        rt::PageGeometry one;
        one.bytesPerPage = kSTATE_BYTES;
        return randomPages(one, 1, seed)[0];
    }
    void writeWithState() const
    {
        rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2, {}, tensors, state.data());
    }
    //! Reads with the state expected into poisoned pages and state; returns whether both stayed poisoned on a throw.
    template <typename Error>
    ::testing::AssertionResult refusedUntouched(
        std::vector<rt::SequenceStateTensor> const& expected, std::vector<std::string> const& words)
    {
        auto loaded = poisoned(geometry, 2);
        std::vector<uint8_t> loadedState(static_cast<size_t>(kSTATE_BYTES), kPAGE_POISON);
        ::testing::AssertionResult result = throwsNaming<Error>([&]
            { rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2, {}, expected, loadedState.data()); },
            words);
        if (!result)
        {
            return result;
        }
        if (!allPoison(loaded) || loadedState != std::vector<uint8_t>(loadedState.size(), kPAGE_POISON))
        {
            return ::testing::AssertionFailure() << "a refused read wrote a page or the state";
        }
        return ::testing::AssertionSuccess();
    }

    rt::KVCacheLayout layout;
    rt::PageGeometry geometry;
    std::vector<rt::SequenceStateTensor> tensors;
    std::vector<std::vector<uint8_t>> pages;
    std::vector<uint8_t> state;
};

TEST_F(SequenceFileStatesTest, StateTensorsOfALayoutAreItsTensorsInPackedOrder)
{
    ASSERT_EQ(tensors.size(), 3U);
    struct Expected
    {
        int32_t layer, tensor;
        rt::DataType type;
        std::vector<int64_t> shape;
        int64_t bytes;
    };
    std::vector<Expected> const expected{{0, 0, rt::DataType::kBF16, {6, 3}, 36},
        {0, 1, rt::DataType::kFLOAT, {2, 4, 4}, 128}, {1, 0, rt::DataType::kINT8, {7}, 7}};
    for (size_t i = 0; i < expected.size(); ++i)
    {
        SCOPED_TRACE(i);
        EXPECT_EQ(tensors[i].stateLayer, expected[i].layer);
        EXPECT_EQ(tensors[i].tensor, expected[i].tensor);
        EXPECT_EQ(tensors[i].dataType, expected[i].type);
        EXPECT_EQ(tensors[i].shape, expected[i].shape);
        EXPECT_EQ(tensors[i].slotBytes, expected[i].bytes);
    }
    rt::KVCacheConfig const stateless = withoutStateLayers(stateLayerConfig());
    EXPECT_TRUE(rt::sequenceStateTensors(rt::computeLayout(stateless)).empty());
}

TEST_F(SequenceFileStatesTest, PagesAndStateRoundTrip)
{
    writeWithState();
    // Header, three checksums (two pages and the state), two pages of 8192 bytes, the state.
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(mPath)), kHEADER_BYTES + 3 * 8 + 2 * 8192 + kSTATE_BYTES);
    rt::SequenceFileInfo const info = rt::readSequenceFileInfo(mPath);
    EXPECT_EQ(info.version, 3U);
    EXPECT_EQ(info.stateBytes, kSTATE_BYTES);
    ASSERT_EQ(info.stateTensors.size(), 3U);
    EXPECT_EQ(info.stateTensors[1].shape, (std::vector<int64_t>{2, 4, 4}));
    EXPECT_EQ(info.stateTensors[2].dataType, rt::DataType::kINT8);

    auto loaded = poisoned(geometry, 2);
    std::vector<uint8_t> loadedState(static_cast<size_t>(kSTATE_BYTES), kPAGE_POISON);
    EXPECT_EQ(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2, {}, tensors, loadedState.data()), 20);
    EXPECT_EQ(loaded, pages);
    EXPECT_EQ(loadedState, state);
    // The state sits after the pages: the file's last kSTATE_BYTES bytes.
    std::vector<char> const bytes = fileBytes();
    EXPECT_EQ(std::memcmp(bytes.data() + bytes.size() - kSTATE_BYTES, state.data(), kSTATE_BYTES), 0);

    // Pages only: the state is verified, not read out.
    auto pagesOnly = poisoned(geometry, 2);
    EXPECT_EQ(rt::readSequenceFile(mPath, geometry, pointers(pagesOnly).data(), 2), 20);
    EXPECT_EQ(pagesOnly, pages);
}

TEST_F(SequenceFileStatesTest, AVersion2FileIsReadAsOneWithoutState)
{
    rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2);
    // The same file in version 2 (docs/layout.md): no state count after the layer record, the header's checksum over
    // the 56 + 24 bytes before it.
    std::vector<char> const v3 = fileBytes();
    int64_t const v2Header = 56 + 24 + 8;
    std::vector<char> v2(v3.begin(), v3.begin() + (v2Header - 8));
    v2.insert(v2.end(), 8, 0);
    v2.insert(v2.end(), v3.begin() + (v2Header + 8), v3.end());
    patchHeader<uint32_t>(v2, v2Header, 8, 2);
    writeBytes(v2);
    rt::SequenceFileInfo const info = rt::readSequenceFileInfo(mPath);
    EXPECT_EQ(info.version, 2U);
    EXPECT_TRUE(info.stateTensors.empty());
    EXPECT_EQ(info.stateBytes, 0);
    auto loaded = poisoned(geometry, 2);
    EXPECT_EQ(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2), 20);
    EXPECT_EQ(loaded, pages);
    EXPECT_TRUE(refusedUntouched<rt::InvalidArgumentError>(tensors, {"holds no state", "3 state tensors"}));
}

TEST_F(SequenceFileStatesTest, AnotherStateOrACorruptOneIsRefusedAndWritesNothing)
{
    writeWithState();
    std::vector<rt::SequenceStateTensor> otherType = tensors;
    otherType[2].dataType = rt::DataType::kUINT8;
    EXPECT_TRUE(refusedUntouched<rt::InvalidArgumentError>(
        otherType, {"another state", "stateTensors[2].dataType", "int8", "uint8"}));
    std::vector<rt::SequenceStateTensor> otherShape = tensors;
    otherShape[0].shape = {3, 6};
    EXPECT_TRUE(refusedUntouched<rt::InvalidArgumentError>(otherShape, {"stateTensors[0].shape", "[6, 3]", "[3, 6]"}));
    std::vector<rt::SequenceStateTensor> const fewer(tensors.begin(), tensors.begin() + 2);
    EXPECT_TRUE(refusedUntouched<rt::InvalidArgumentError>(fewer, {"stateTensors has 3 entries", "2"}));

    // A flipped byte in the state: its checksum refuses it.
    std::vector<char> bad = fileBytes();
    bad[bad.size() - 5] = static_cast<char>(bad[bad.size() - 5] ^ 0x10);
    writeBytes(bad);
    EXPECT_TRUE(refusedUntouched<rt::InvalidArgumentError>(tensors, {"state is corrupt", "checksum"}));
    auto loaded = poisoned(geometry, 2);
    EXPECT_THROW(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2), rt::InvalidArgumentError);
    EXPECT_TRUE(allPoison(loaded));
    // Truncated by one byte.
    bad = fileBytes();
    bad.pop_back();
    writeBytes(bad);
    EXPECT_TRUE(refusedUntouched<rt::InvalidArgumentError>(tensors, {"truncated"}));
}

TEST_F(SequenceFileStatesTest, CorruptStateRecordsWithAValidChecksumAreRefused)
{
    writeWithState();
    std::vector<char> const good = fileBytes();
    // A record: stateLayer +0, tensor +4, dataType +8, dimensions +12, slotBytes +16, extents from +24.
    int64_t const second = kSTATE_RECORDS_AT + 80;
    std::vector<BadHeaderField> const cases{
        {second + 4, 2, false, {"stateTensors[1] is state layer 0 tensor 2", "layer by layer"}},
        {kSTATE_RECORDS_AT, 1, false, {"stateTensors[0] is state layer 1 tensor 0"}},
        {second + 8, 99, false, {"stateTensors[1].dataType is 99", "not a DataType"}},
        {second + 12, 0, false, {"stateTensors[1] has 0 dimensions", "1 to 7"}},
        {second + 12, 8, false, {"stateTensors[1] has 8 dimensions", "1 to 7"}},
        {second + 16, 129, true, {"stateTensors[1].slotBytes is 129", "makes 128"}},
        {second + 24, -2, true, {"stateTensors[1].shape[0] is -2", "> 0"}},
        {second + 24 + 3 * 8, 5, true, {"stateTensors[1] extent 3", "is 5", "must be 0"}},
    };
    for (BadHeaderField const& c : cases)
    {
        writeBytes(withBadField(good, kHEADER_BYTES, c));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::readSequenceFileInfo(mPath); }, c.words))
            << "byte " << c.offset << " = " << c.value;
        EXPECT_TRUE(refusedUntouched<rt::InvalidArgumentError>(tensors, {}));
    }
    // A count beyond the limit, or negative: refused before the records are read; then a reserved field.
    for (int32_t const count : {(1 << 16) + 1, -1})
    {
        std::vector<char> bad = good;
        std::memcpy(bad.data() + kSTATE_RECORDS_AT - 8, &count, sizeof(count));
        writeBytes(bad);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::readSequenceFileInfo(mPath); }, {"numStateTensors is " + std::to_string(count), "65536"}));
    }
    std::vector<char> bad = good;
    int32_t const reserved = 3;
    std::memcpy(bad.data() + kSTATE_RECORDS_AT - 4, &reserved, sizeof(reserved));
    writeBytes(bad);
    EXPECT_TRUE(
        throwsNaming<rt::InvalidArgumentError>([&] { rt::readSequenceFileInfo(mPath); }, {"reserved", "must be 0"}));
}

TEST_F(SequenceFileStatesTest, BadStateArgumentsAreRefusedAndLeaveNoFile)
{
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2, {}, tensors, nullptr); },
        {"state is null", "3 state tensors"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2, {}, {}, state.data()); },
        {"state is given", "0 state tensors"}));
    std::vector<rt::SequenceStateTensor> swapped{tensors[1], tensors[0], tensors[2]};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2, {}, swapped, state.data()); },
        {"stateTensors[0] is state layer 0 tensor 1"}));
    std::vector<rt::SequenceStateTensor> wrongBytes = tensors;
    wrongBytes[0].slotBytes = 35;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2, {}, wrongBytes, state.data()); },
        {"stateTensors[0].slotBytes is 35", "makes 36"}));
    std::vector<rt::SequenceStateTensor> huge = tensors;
    huge[0].shape = {int64_t{1} << 40, int64_t{1} << 40};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2, {}, huge, state.data()); },
        {"stateTensors[0].slotBytes is 36", "more than 64-bit sizes hold"}));
    EXPECT_FALSE(fs::exists(mPath));
    EXPECT_EQ(std::distance(fs::directory_iterator(mDir), fs::directory_iterator()), 0);

    writeWithState();
    auto loaded = poisoned(geometry, 2);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2, {}, tensors, nullptr); },
        {"state is null", "3 expected state tensors"}));
    EXPECT_TRUE(allPoison(loaded));
}

} // namespace
} // namespace kvcache::test
