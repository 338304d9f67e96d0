#pragma once

// The KV cache element types as GoogleTest type lists, each with an unsigned integer of its size to move raw bits.

#include "kvcache/core/data_type.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace kvcache::test
{

namespace detail
{
template <int64_t BYTES>
struct BitsOfSize;
template <>
struct BitsOfSize<1>
{
    using Type = uint8_t;
};
template <>
struct BitsOfSize<2>
{
    using Type = uint16_t;
};
template <>
struct BitsOfSize<4>
{
    using Type = uint32_t;
};
} // namespace detail

//! Tags a KV cache type for typed tests: `value` is the type, `Bits` an unsigned integer of its element size.
template <rt::DataType TYPE>
struct DataTypeTag : std::integral_constant<rt::DataType, TYPE>
{
    using Bits = typename detail::BitsOfSize<rt::dataTypeSize(TYPE)>::Type;
};

//! Every type a KV cache may hold.
using AllKVCacheDataTypes = ::testing::Types<DataTypeTag<rt::DataType::kFLOAT>, DataTypeTag<rt::DataType::kHALF>,
    DataTypeTag<rt::DataType::kBF16>, DataTypeTag<rt::DataType::kFP8_E4M3>, DataTypeTag<rt::DataType::kFP8_E5M2>,
    DataTypeTag<rt::DataType::kINT8>, DataTypeTag<rt::DataType::kUINT8>>;

//! One type of each element size.
using OneKVCacheDataTypePerSize = ::testing::Types<DataTypeTag<rt::DataType::kFLOAT>, DataTypeTag<rt::DataType::kBF16>,
    DataTypeTag<rt::DataType::kFP8_E4M3>>;

//! Names typed-test instances after their data type ("float16", "fp8_e4m3", ...).
struct DataTypeNames
{
    template <typename T>
    static std::string GetName(int /*index*/)
    {
        return std::string(rt::dataTypeName(T::value));
    }
};

} // namespace kvcache::test
