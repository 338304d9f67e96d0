#pragma once

// The DLPack exchange structs, written from the public DLPack specification (dlpack.h 1.x; the struct layout is that
// of 1.0, the float8 type codes were added in 1.1). Only what the binding produces and reads is declared.

#include <cstdint>

namespace kvcache::python
{

//! DLDeviceType values the binding produces or accepts.
enum DLDeviceType : int32_t
{
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLCUDAManaged = 13,
};

//! Where a DLTensor's memory lives.
struct DLDevice
{
    DLDeviceType device_type;
    int32_t device_id;
};

//! DLDataTypeCode values (DLPack 1.1 numbering).
enum DLDataTypeCode : uint8_t
{
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLBfloat = 4,
    kDLFloat8_e4m3fn = 10,
    kDLFloat8_e5m2 = 12,
};

//! Element type: type code, bits per lane, lanes.
struct DLDataType
{
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
};

//! A strided view of memory (shape and strides in elements; strides may be null for row-major).
struct DLTensor
{
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
};

//! The unversioned managed tensor, carried by a capsule named "dltensor".
struct DLManagedTensor
{
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor* self);
};

//! A DLPack version, major then minor.
struct DLPackVersion
{
    uint32_t major;
    uint32_t minor;
};

//! Flag of DLManagedTensorVersioned: the consumer must not write through the tensor.
inline constexpr uint64_t kDLPACK_FLAG_READ_ONLY = 1ULL << 0;

//! The versioned managed tensor (DLPack >= 1.0), carried by a capsule named "dltensor_versioned".
struct DLManagedTensorVersioned
{
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(DLManagedTensorVersioned* self);
    uint64_t flags;
    DLTensor dl_tensor;
};

//! The DLPack version this binding reports in the versioned capsule.
inline constexpr DLPackVersion kDLPACK_VERSION{1, 1};

//! Capsule names of the protocol; a consumer renames a capsule to the "used_" form once it owns the tensor.
inline constexpr char kCAPSULE_LEGACY[] = "dltensor";
inline constexpr char kCAPSULE_LEGACY_USED[] = "used_dltensor";
inline constexpr char kCAPSULE_VERSIONED[] = "dltensor_versioned";
inline constexpr char kCAPSULE_VERSIONED_USED[] = "used_dltensor_versioned";

} // namespace kvcache::python
