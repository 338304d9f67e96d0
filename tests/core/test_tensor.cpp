#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/tensor.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache::rt
{
//! Prints a Coords as [a, b, c] in GoogleTest failure messages.
void PrintTo(Coords const& coords, std::ostream* os)
{
    *os << '[';
    for (int32_t i = 0; i < coords.getNumDims(); ++i)
    {
        *os << (i == 0 ? "" : ", ") << coords[i];
    }
    *os << ']';
}

namespace
{

//! Row-major strides worked out here, independently of the library: the last dimension is dense and each
//! dimension steps over the whole of the dimensions after it.
Coords rowMajorStrides(Coords const& shape)
{
    Coords strides = shape;
    int32_t const rank = shape.getNumDims();
    if (rank == 0)
    {
        return strides;
    }
    strides[rank - 1] = 1;
    for (int32_t i = rank - 1; i > 0; --i)
    {
        strides[i - 1] = strides[i] * shape[i];
    }
    return strides;
}

// ---------------------------------------------------------------------------------------------------------------
// Coords

TEST(Coords, DefaultIsZeroDimensionalWithVolumeOne)
{
    Coords const empty;
    EXPECT_EQ(empty.getNumDims(), 0);
    EXPECT_EQ(empty.volume(), 1);
    EXPECT_THROW(static_cast<void>(empty[0]), OutOfRangeError);
}

TEST(Coords, ConstructionKeepsExtentsInOrder)
{
    Coords const c{7, 3, 11, 2};
    ASSERT_EQ(c.getNumDims(), 4);
    EXPECT_EQ(c[0], 7);
    EXPECT_EQ(c[1], 3);
    EXPECT_EQ(c[2], 11);
    EXPECT_EQ(c[3], 2);
}

TEST(Coords, HoldsExtentsBeyondInt32)
{
    int64_t const big = int64_t{1} << 40;
    Coords const c{big, 3};
    EXPECT_EQ(c[0], big);
    EXPECT_EQ(c.volume(), 3 * big);
}

TEST(Coords, EightDimsAllowedNineThrow)
{
    Coords const eight{1, 2, 3, 4, 5, 6, 7, 8};
    EXPECT_EQ(eight.getNumDims(), Coords::kMAX_DIMS);
    EXPECT_EQ(eight[7], 8);
    EXPECT_EQ(eight.volume(), 40320); // 8!
    EXPECT_THROW((Coords{1, 2, 3, 4, 5, 6, 7, 8, 9}), InvalidArgumentError);
}

TEST(Coords, IndexIsBoundsChecked)
{
    Coords c{4, 5, 6};
    Coords const& constC = c;
    EXPECT_THROW(static_cast<void>(constC[3]), OutOfRangeError);
    EXPECT_THROW(static_cast<void>(constC[-1]), OutOfRangeError);
    EXPECT_THROW(static_cast<void>(constC[Coords::kMAX_DIMS]), OutOfRangeError);
    EXPECT_THROW(c[3] = 1, OutOfRangeError);
    EXPECT_THROW(c[-1] = 1, OutOfRangeError);
    // An index inside kMAX_DIMS but past getNumDims() is out of range too.
    EXPECT_THROW(c[5] = 1, OutOfRangeError);
    EXPECT_EQ(c.getNumDims(), 3);
}

TEST(Coords, MutableIndexWritesTheExtent)
{
    Coords c{4, 5, 6};
    c[1] = 9;
    EXPECT_EQ(c[0], 4);
    EXPECT_EQ(c[1], 9);
    EXPECT_EQ(c[2], 6);
    EXPECT_EQ(c.volume(), 4 * 9 * 6);
}

TEST(Coords, Volume)
{
    EXPECT_EQ((Coords{5}).volume(), 5);
    EXPECT_EQ((Coords{2, 3, 4}).volume(), 24);
    EXPECT_EQ((Coords{3, 0, 5}).volume(), 0);
    EXPECT_EQ((Coords{1, 1, 1, 1}).volume(), 1);
}

TEST(Coords, Equality)
{
    Coords const a{2, 3, 4};
    Coords const same{2, 3, 4};
    Coords const otherExtent{2, 3, 5};
    Coords const otherRank{2, 3, 4, 1};
    Coords const prefix{2, 3};
    EXPECT_TRUE(a == same);
    EXPECT_FALSE(a != same);
    EXPECT_FALSE(a == otherExtent);
    EXPECT_TRUE(a != otherExtent);
    EXPECT_FALSE(a == otherRank);
    EXPECT_TRUE(a != otherRank);
    EXPECT_FALSE(a == prefix);
    EXPECT_TRUE(Coords{} == Coords{});
    EXPECT_FALSE(Coords{} == Coords{1});
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor

TEST(Tensor, DefaultIsEmpty)
{
    Tensor const t;
    EXPECT_EQ(t.rawPointer(), nullptr);
    EXPECT_EQ(t.getShape().getNumDims(), 0);
}

TEST(Tensor, ContiguousConstructorComputesRowMajorStrides)
{
    std::vector<float> storage(2 * 3 * 4 * 5, 1.5F);
    std::vector<Coords> const shapes = {Coords{7}, Coords{3, 4}, Coords{2, 3, 4}, Coords{2, 3, 4, 5},
        Coords{5, 1, 4, 1, 3}, Coords{2, 2, 2, 2, 2, 2, 2, 2}};
    for (Coords const& shape : shapes)
    {
        Tensor const t(storage.data(), shape, DataType::kFLOAT, DeviceType::kCPU);
        Coords const expected = rowMajorStrides(shape);
        EXPECT_EQ(t.getShape(), shape);
        EXPECT_EQ(t.getStride(), expected) << "rank " << shape.getNumDims();
        EXPECT_EQ(contiguousStrides(shape), expected) << "rank " << shape.getNumDims();
        EXPECT_TRUE(t.isContiguous());
    }
}

TEST(Tensor, ContiguousStridesByHand)
{
    // [2, 3, 4, 5]: the last dim is dense, then 5, 4*5, 3*4*5.
    EXPECT_EQ(contiguousStrides(Coords{2, 3, 4, 5}), (Coords{60, 20, 5, 1}));
    EXPECT_EQ(contiguousStrides(Coords{9}), (Coords{1}));
}

TEST(Tensor, ExplicitStridesAreKept)
{
    std::vector<uint16_t> storage(64, 0x3C00);
    Coords const shape{4, 3};
    Coords const columnMajor{1, 4};
    Tensor const t(storage.data(), shape, columnMajor, DataType::kHALF, DeviceType::kCPU);
    EXPECT_EQ(t.getShape(), shape);
    EXPECT_EQ(t.getStride(), columnMajor);
    EXPECT_EQ(t.rawPointer(), storage.data());
    EXPECT_EQ(t.volume(), 12);
    EXPECT_FALSE(t.isContiguous());
}

TEST(Tensor, PointerTypeAndDevice)
{
    std::vector<uint16_t> storage(24, 0xBEEF);
    Tensor const t(storage.data(), Coords{2, 3, 4}, DataType::kBF16, DeviceType::kGPU);
    EXPECT_EQ(t.rawPointer(), static_cast<void*>(storage.data()));
    EXPECT_EQ(t.dataPointer<uint16_t>(), storage.data());
    EXPECT_EQ(t.dataPointer<int16_t>(), reinterpret_cast<int16_t*>(storage.data()));
    EXPECT_THROW(static_cast<void>(t.dataPointer<float>()), InvalidArgumentError);
    EXPECT_THROW(static_cast<void>(t.dataPointer<uint8_t>()), InvalidArgumentError);
    EXPECT_THROW(static_cast<void>(t.dataPointer<int64_t>()), InvalidArgumentError);
    EXPECT_EQ(t.getDataType(), DataType::kBF16);
    EXPECT_EQ(t.getDeviceType(), DeviceType::kGPU);

    std::vector<int8_t> bytes(8, 5);
    Tensor const q(bytes.data(), Coords{8}, DataType::kFP8_E4M3, DeviceType::kCPU);
    EXPECT_EQ(q.dataPointer<int8_t>(), bytes.data());
    EXPECT_THROW(static_cast<void>(q.dataPointer<uint16_t>()), InvalidArgumentError);
    EXPECT_EQ(q.getDataType(), DataType::kFP8_E4M3);
    EXPECT_EQ(q.getDeviceType(), DeviceType::kCPU);
}

TEST(Tensor, VolumeAndSizeBytes)
{
    std::vector<float> storage(2 * 3 * 4, 2.5F);
    Tensor const f32(storage.data(), Coords{2, 3, 4}, DataType::kFLOAT, DeviceType::kCPU);
    EXPECT_EQ(f32.volume(), 24);
    EXPECT_EQ(f32.sizeBytes(), 24 * 4);
    Tensor const f16(storage.data(), Coords{2, 3, 4}, DataType::kHALF, DeviceType::kCPU);
    EXPECT_EQ(f16.sizeBytes(), 24 * 2);
    Tensor const i64(storage.data(), Coords{3}, DataType::kINT64, DeviceType::kCPU);
    EXPECT_EQ(i64.sizeBytes(), 3 * 8);
    Tensor const empty(storage.data(), Coords{3, 0}, DataType::kFLOAT, DeviceType::kCPU);
    EXPECT_EQ(empty.volume(), 0);
    EXPECT_EQ(empty.sizeBytes(), 0);
    // A strided view's sizeBytes counts the elements it describes, not the span it covers.
    Tensor const strided(storage.data(), Coords{2, 3}, Coords{12, 4}, DataType::kFLOAT, DeviceType::kCPU);
    EXPECT_EQ(strided.volume(), 6);
    EXPECT_EQ(strided.sizeBytes(), 6 * 4);
}

TEST(Tensor, IsContiguous)
{
    std::vector<float> storage(256, 3.0F);
    void* p = storage.data();
    auto const view = [p](Coords const& shape, Coords const& stride)
    { return Tensor(p, shape, stride, DataType::kFLOAT, DeviceType::kCPU); };

    EXPECT_TRUE(view(Coords{2, 3, 4}, Coords{12, 4, 1}).isContiguous());
    // Padded rows, transposed, and a dense-but-wrong innermost stride are not row-major.
    EXPECT_FALSE(view(Coords{2, 3, 4}, Coords{16, 4, 1}).isContiguous());
    EXPECT_FALSE(view(Coords{2, 3, 4}, Coords{12, 1, 3}).isContiguous());
    EXPECT_FALSE(view(Coords{2, 3, 4}, Coords{24, 8, 2}).isContiguous());
    EXPECT_FALSE(view(Coords{3, 4}, Coords{1, 3}).isContiguous());
    // Extents of 1 never step, so their stride may be anything.
    EXPECT_TRUE(view(Coords{1, 3, 1, 2}, Coords{999, 2, 77, 1}).isContiguous());
    EXPECT_TRUE(view(Coords{4, 1}, Coords{1, 5}).isContiguous());
    EXPECT_TRUE(view(Coords{1}, Coords{3}).isContiguous());
    // ...but an extent-1 dim does not excuse a wrong stride elsewhere.
    EXPECT_FALSE(view(Coords{1, 3, 1, 2}, Coords{999, 3, 77, 1}).isContiguous());
}

TEST(Tensor, RejectsNegativeExtentsAndMismatchedStrideRank)
{
    std::vector<float> storage(16, 1.0F);
    EXPECT_THROW(Tensor(storage.data(), Coords{2, -1}, DataType::kFLOAT, DeviceType::kCPU), InvalidArgumentError);
    EXPECT_THROW(
        Tensor(storage.data(), Coords{-4}, Coords{1}, DataType::kFLOAT, DeviceType::kCPU), InvalidArgumentError);
    EXPECT_THROW(
        Tensor(storage.data(), Coords{2, 3}, Coords{1}, DataType::kFLOAT, DeviceType::kCPU), InvalidArgumentError);
    EXPECT_THROW(Tensor(storage.data(), Coords{2, 3}, Coords{3, 1, 1}, DataType::kFLOAT, DeviceType::kCPU),
        InvalidArgumentError);
}

TEST(Tensor, ReshapeKeepsPointerTypeAndDevice)
{
    std::vector<uint16_t> storage(2 * 3 * 4, 0x1234);
    Tensor const t(storage.data(), Coords{2, 3, 4}, DataType::kHALF, DeviceType::kGPU);
    Tensor const r = t.reshape(Coords{6, 4});
    EXPECT_EQ(r.getShape(), (Coords{6, 4}));
    EXPECT_EQ(r.getStride(), (Coords{4, 1}));
    EXPECT_EQ(r.rawPointer(), t.rawPointer());
    EXPECT_EQ(r.getDataType(), DataType::kHALF);
    EXPECT_EQ(r.getDeviceType(), DeviceType::kGPU);
    EXPECT_EQ(r.volume(), 24);
    EXPECT_TRUE(r.isContiguous());

    Tensor const flat = t.reshape(Coords{24});
    EXPECT_EQ(flat.getShape(), (Coords{24}));
    EXPECT_EQ(flat.rawPointer(), storage.data());

    Tensor const deeper = r.reshape(Coords{2, 1, 12, 1});
    EXPECT_EQ(deeper.getShape(), (Coords{2, 1, 12, 1}));
    EXPECT_EQ(deeper.rawPointer(), storage.data());
    // The source is left as it was.
    EXPECT_EQ(t.getShape(), (Coords{2, 3, 4}));
}

TEST(Tensor, ReshapeToAnotherVolumeThrows)
{
    std::vector<float> storage(24, 1.0F);
    Tensor const t(storage.data(), Coords{2, 3, 4}, DataType::kFLOAT, DeviceType::kCPU);
    EXPECT_THROW(static_cast<void>(t.reshape(Coords{5, 5})), InvalidArgumentError);
    EXPECT_THROW(static_cast<void>(t.reshape(Coords{23})), InvalidArgumentError);
    EXPECT_THROW(static_cast<void>(t.reshape(Coords{2, 3, 4, 2})), InvalidArgumentError);
    // Same volume by sign trick, but negative extents are never a shape.
    EXPECT_THROW(static_cast<void>(t.reshape(Coords{-2, -12})), InvalidArgumentError);
}

TEST(Tensor, ReshapeOfNonContiguousViewThrows)
{
    std::vector<float> storage(64, 1.0F);
    // Every other row of a [4, 3] matrix stored with row pitch 6.
    Tensor const strided(storage.data(), Coords{4, 3}, Coords{6, 1}, DataType::kFLOAT, DeviceType::kCPU);
    ASSERT_FALSE(strided.isContiguous());
    EXPECT_THROW(static_cast<void>(strided.reshape(Coords{12})), InvalidArgumentError);
    EXPECT_THROW(static_cast<void>(strided.reshape(Coords{4, 3})), InvalidArgumentError);
}

// ---------------------------------------------------------------------------------------------------------------
// Data types

struct DataTypeFacts
{
    DataType type;
    int64_t size;
    std::string_view name;
    bool kvCache;
};

// Written out by hand from the meaning of each type.
constexpr std::array<DataTypeFacts, 9> kDATA_TYPE_FACTS = {{
    {DataType::kFLOAT, 4, "float32", true},
    {DataType::kHALF, 2, "float16", true},
    {DataType::kBF16, 2, "bfloat16", true},
    {DataType::kFP8_E4M3, 1, "fp8_e4m3", true},
    {DataType::kFP8_E5M2, 1, "fp8_e5m2", true},
    {DataType::kINT8, 1, "int8", true},
    {DataType::kUINT8, 1, "uint8", true},
    {DataType::kINT32, 4, "int32", false},
    {DataType::kINT64, 8, "int64", false},
}};

TEST(DataType, SizesNamesAndKVCacheSupport)
{
    for (auto const& facts : kDATA_TYPE_FACTS)
    {
        SCOPED_TRACE(std::string(facts.name));
        EXPECT_EQ(dataTypeSize(facts.type), facts.size);
        EXPECT_EQ(dataTypeName(facts.type), facts.name);
        EXPECT_EQ(isKVCacheDataType(facts.type), facts.kvCache);
    }
}

TEST(DataType, ValueOutsideTheEnumeration)
{
    auto const bogus = static_cast<DataType>(99);
    EXPECT_EQ(dataTypeSize(bogus), 0);
    EXPECT_EQ(dataTypeName(bogus), "unknown");
    EXPECT_FALSE(isKVCacheDataType(bogus));
    auto const negative = static_cast<DataType>(-1);
    EXPECT_EQ(dataTypeSize(negative), 0);
    EXPECT_FALSE(isKVCacheDataType(negative));
}

TEST(DataType, UsableAtCompileTime)
{
    static_assert(dataTypeSize(DataType::kHALF) == 2);
    static_assert(isKVCacheDataType(DataType::kFP8_E5M2));
    static_assert(!isKVCacheDataType(DataType::kINT32));
    EXPECT_EQ(dataTypeName(DataType::kUINT8), "uint8");
}

} // namespace
} // namespace kvcache::rt
