#pragma once

#include "dlpack.h"

#include <kvcache/core/data_type.h>
#include <kvcache/core/tensor.h>

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>

#include <array>
#include <cstdint>

namespace kvcache::python
{

namespace nb = nanobind;

//! The stream a view's memory was last written on and an event to order other streams after it (no host wait).
struct StreamOrder
{
    //! The stream whose work a consumer must see; rewritten when the producer changes streams (a page-table build).
    cudaStream_t producer = nullptr;
    //! Recorded on `producer` for each wait; created without timing on `device`.
    cudaEvent_t event = nullptr;
    int32_t device = 0;

    //! Makes `consumer` wait for the work enqueued on `producer` so far (cudaEventRecord + cudaStreamWaitEvent);
    //! nothing when they are the same stream. Throws CudaError.
    void orderBefore(cudaStream_t consumer) const;
};

//! Returns the DLPack element type of `type`; throws InvalidArgumentError outside the enumeration.
DLDataType dlpackDataType(rt::DataType type);

//! Returns the cudaStream_t a DLPack `stream` argument names for a CUDA consumer (1: legacy default stream, 2: the
//! per-thread default stream, above 2: the handle); throws InvalidArgumentError for 0 and values below -1.
cudaStream_t dlpackConsumerStream(int64_t stream);

//! A zero-copy view of memory that implements the DLPack protocol. It holds a reference to its owner (the Python
//! object that owns the memory) and every exported capsule holds another, so the memory outlives all consumers.
class DLPackView
{
public:
    //! Describes `tensor` on device (deviceType, deviceId); `order` (may be null, must live as long as `owner`)
    //! orders a consumer's stream after the producer's.
    DLPackView(rt::Tensor const& tensor, DLDeviceType deviceType, int32_t deviceId, StreamOrder const* order,
        nb::object owner);

    //! Implements __dlpack__: a "dltensor_versioned" capsule when max_version's major is >= 1, else "dltensor".
    //! Throws BufferError for copy=True, another dl_device or a stream on a CPU view.
    nb::object exportCapsule(nb::handle stream, nb::handle maxVersion, nb::handle dlDevice, nb::handle copy) const;
    //! Implements __dlpack_device__: (device type, device id).
    nb::tuple device() const;

    //! Returns the address of element (0, ..., 0).
    uintptr_t dataPtr() const noexcept
    {
        return reinterpret_cast<uintptr_t>(mData);
    }
    //! Returns the extents.
    nb::tuple shape() const;
    //! Returns the strides in elements.
    nb::tuple strides() const;
    //! Returns the element type.
    rt::DataType dataType() const noexcept
    {
        return mDataType;
    }
    //! Returns the number of dimensions.
    int32_t ndim() const noexcept
    {
        return mNdim;
    }
    //! Returns the bytes the view spans (product of extents times element size).
    int64_t nbytes() const noexcept;
    //! Returns the object that owns the memory.
    nb::object owner() const
    {
        return mOwner;
    }

private:
    void* mData{nullptr};
    int32_t mNdim{0};
    std::array<int64_t, rt::Coords::kMAX_DIMS> mShape{};
    std::array<int64_t, rt::Coords::kMAX_DIMS> mStrides{};
    rt::DataType mDataType{rt::DataType::kHALF};
    DLDevice mDevice{kDLCUDA, 0};
    StreamOrder const* mOrder{nullptr};
    nb::object mOwner;
};

//! Registers View and the DLPack helpers (_dlpack_dtype, _describe_capsule, _view_of_buffer) in `m`.
void bindViews(nb::module_& m);

} // namespace kvcache::python
