#pragma once

#include <cstdint>
#include <string_view>

namespace kvcache::rt
{

//! Element types a tensor view can describe.
enum class DataType : int32_t
{
    kFLOAT = 0,
    kHALF = 1,
    kBF16 = 2,
    kFP8_E4M3 = 3,
    kFP8_E5M2 = 4,
    kINT8 = 5,
    kUINT8 = 6,
    kINT32 = 7,
    kINT64 = 8,
};

//! Returns the size of one element of `type` in bytes, or 0 for a value outside the enumeration.
constexpr int64_t dataTypeSize(DataType type) noexcept
{
    switch (type)
    {
    case DataType::kFLOAT: return 4;
    case DataType::kHALF: return 2;
    case DataType::kBF16: return 2;
    case DataType::kFP8_E4M3: return 1;
    case DataType::kFP8_E5M2: return 1;
    case DataType::kINT8: return 1;
    case DataType::kUINT8: return 1;
    case DataType::kINT32: return 4;
    case DataType::kINT64: return 8;
    }
    return 0;
}

//! Returns the printable name of `type` ("float16", "fp8_e4m3", ...), or "unknown" outside the enumeration.
constexpr std::string_view dataTypeName(DataType type) noexcept
{
    switch (type)
    {
    case DataType::kFLOAT: return "float32";
    case DataType::kHALF: return "float16";
    case DataType::kBF16: return "bfloat16";
    case DataType::kFP8_E4M3: return "fp8_e4m3";
    case DataType::kFP8_E5M2: return "fp8_e5m2";
    case DataType::kINT8: return "int8";
    case DataType::kUINT8: return "uint8";
    case DataType::kINT32: return "int32";
    case DataType::kINT64: return "int64";
    }
    return "unknown";
}

//! Returns true when `type` may hold a KV cache: floating-point and 8-bit quantised types, not int32/int64.
constexpr bool isKVCacheDataType(DataType type) noexcept
{
    switch (type)
    {
    case DataType::kFLOAT:
    case DataType::kHALF:
    case DataType::kBF16:
    case DataType::kFP8_E4M3:
    case DataType::kFP8_E5M2:
    case DataType::kINT8:
    case DataType::kUINT8: return true;
    case DataType::kINT32:
    case DataType::kINT64: return false;
    }
    return false;
}

} // namespace kvcache::rt
