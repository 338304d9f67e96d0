#pragma once

// What the host tests of sequence files share: a fixture with a folder of its own, pages of random bytes and poisoned
// pages, the file's bytes, and header fields rewritten under a recomputed checksum. A test including this header
// needs xxhash.h on its include path (target_include_directories ... KVCACHE_XXHASH_INCLUDE_DIR).

#include "kvcache/tiers/sequence_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvcache::test
{

//! The byte pages are poisoned with before a read that must not write them.
inline constexpr uint8_t kPAGE_POISON = 0xAB;

//! A folder of the test's own, removed afterwards, and `mPath` in it.
class SequenceFileFixture : public ::testing::Test
{
protected:
    void SetUp() override
    {
        mDir = std::filesystem::temp_directory_path()
            / ("kvcache_sequence_file_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_"
                + ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "_"
                + ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(mDir);
        std::filesystem::create_directories(mDir);
        mPath = (mDir / "sequence.kvseq").string();
    }
    void TearDown() override
    {
        std::filesystem::remove_all(mDir);
    }

    //! `count` pages of distinct pseudo-random bytes.
    static std::vector<std::vector<uint8_t>> randomPages(rt::PageGeometry const& geometry, int count, uint32_t seed)
    {
        std::mt19937 generator(seed);
        std::vector<std::vector<uint8_t>> pages(static_cast<size_t>(count));
        for (auto& page : pages)
        {
            page.resize(static_cast<size_t>(geometry.bytesPerPage));
            for (auto& byte : page)
            {
                byte = static_cast<uint8_t>(generator());
            }
        }
        return pages;
    }
    static std::vector<void const*> pointers(std::vector<std::vector<uint8_t>> const& pages)
    {
        std::vector<void const*> out;
        for (auto const& page : pages)
        {
            out.push_back(page.data());
        }
        return out;
    }
    static std::vector<void*> pointers(std::vector<std::vector<uint8_t>>& pages)
    {
        std::vector<void*> out;
        for (auto& page : pages)
        {
            out.push_back(page.data());
        }
        return out;
    }
    static std::vector<std::vector<uint8_t>> poisoned(rt::PageGeometry const& geometry, int count)
    {
        return std::vector<std::vector<uint8_t>>(
            static_cast<size_t>(count), std::vector<uint8_t>(static_cast<size_t>(geometry.bytesPerPage), kPAGE_POISON));
    }
    static bool allPoison(std::vector<std::vector<uint8_t>> const& pages)
    {
        for (auto const& page : pages)
        {
            for (uint8_t const byte : page)
            {
                if (byte != kPAGE_POISON)
                {
                    return false;
                }
            }
        }
        return true;
    }
    std::vector<char> fileBytes() const
    {
        std::ifstream in(mPath, std::ios::binary);
        return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    void writeBytes(std::vector<char> const& bytes) const
    {
        std::ofstream out(mPath, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }

    std::filesystem::path mDir;
    std::string mPath;
};

//! Writes `value` at `offset` of a header of `headerBytes` bytes at the start of `bytes` and recomputes the header's
//! checksum (XXH3-64 of all the header before its last 8 bytes), so only the field's own check can refuse it.
template <typename T>
void patchHeader(std::vector<char>& bytes, int64_t headerBytes, int64_t offset, T value)
{
    std::memcpy(bytes.data() + offset, &value, sizeof(T));
    uint64_t const checksum = XXH3_64bits(bytes.data(), static_cast<size_t>(headerBytes - 8));
    std::memcpy(bytes.data() + headerBytes - 8, &checksum, sizeof(checksum));
}

//! A header field set to a value its own check must refuse, and the words the refusal must name.
struct BadHeaderField
{
    int64_t offset;
    int64_t value;
    bool wide; //!< an int64 field; otherwise an int32 one
    std::vector<std::string> words;
};

//! Returns `bytes` with `field` written into its header of `headerBytes` bytes, under a recomputed checksum.
inline std::vector<char> withBadField(std::vector<char> bytes, int64_t headerBytes, BadHeaderField const& field)
{
    if (field.wide)
    {
        patchHeader<int64_t>(bytes, headerBytes, field.offset, field.value);
    }
    else
    {
        patchHeader<int32_t>(bytes, headerBytes, field.offset, static_cast<int32_t>(field.value));
    }
    return bytes;
}

} // namespace kvcache::test
