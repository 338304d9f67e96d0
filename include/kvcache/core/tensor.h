#pragma once

#include "kvcache/core/data_type.h"

#include <array>
#include <cstdint>
#include <initializer_list>

namespace kvcache::rt
{

//! Where the memory a Tensor points at lives.
enum class DeviceType : int32_t
{
    kCPU = 0,
    kGPU = 1,
};

//! A shape or stride of up to kMAX_DIMS 64-bit extents; indexing is bounds-checked.
class Coords
{
public:
    static constexpr int32_t kMAX_DIMS = 8;

    //! An empty (zero-dimensional) coordinate list.
    Coords() noexcept = default;
    //! Builds from a list of extents; throws InvalidArgumentError for more than kMAX_DIMS entries.
    Coords(std::initializer_list<int64_t> dims);

    //! Returns the number of dimensions.
    int32_t getNumDims() const noexcept
    {
        return mNumDims;
    }
    //! Returns extent `dim`; throws OutOfRangeError when `dim` is outside [0, getNumDims()).
    int64_t operator[](int32_t dim) const;
    //! Returns a reference to extent `dim`; throws OutOfRangeError when `dim` is outside [0, getNumDims()).
    int64_t& operator[](int32_t dim);
    //! Returns the product of the extents (1 for zero dimensions).
    int64_t volume() const noexcept;

    //! Returns true when both have the same number of dimensions and the same extents.
    friend bool operator==(Coords const& a, Coords const& b) noexcept
    {
        if (a.mNumDims != b.mNumDims)
        {
            return false;
        }
        for (int32_t i = 0; i < a.mNumDims; ++i)
        {
            if (a.mDims[i] != b.mDims[i])
            {
                return false;
            }
        }
        return true;
    }
    //! Returns true when the coordinate lists differ.
    friend bool operator!=(Coords const& a, Coords const& b) noexcept
    {
        return !(a == b);
    }

private:
    int32_t mNumDims{0};
    std::array<int64_t, kMAX_DIMS> mDims{};
};

//! A non-owning view of memory: pointer, shape, strides in elements, element type and device.
class Tensor
{
public:
    //! An empty view (null pointer, zero dimensions).
    Tensor() noexcept = default;
    //! A contiguous (row-major) view; throws InvalidArgumentError for a negative extent.
    Tensor(void* data, Coords const& shape, DataType type, DeviceType device);
    //! A strided view; throws InvalidArgumentError for a negative extent or a stride list of another rank.
    Tensor(void* data, Coords const& shape, Coords const& stride, DataType type, DeviceType device);

    //! Returns the extents.
    Coords const& getShape() const noexcept
    {
        return mShape;
    }
    //! Returns the strides, in elements.
    Coords const& getStride() const noexcept
    {
        return mStride;
    }
    //! Returns the pointer to element (0, ..., 0).
    void* rawPointer() const noexcept
    {
        return mData;
    }
    //! Returns the pointer as `T*`; throws InvalidArgumentError when sizeof(T) is not the element size.
    template <typename T>
    T* dataPointer() const
    {
        checkElementSize(static_cast<int64_t>(sizeof(T)));
        return static_cast<T*>(mData);
    }
    //! Returns the element type.
    DataType getDataType() const noexcept
    {
        return mDataType;
    }
    //! Returns where the memory lives.
    DeviceType getDeviceType() const noexcept
    {
        return mDeviceType;
    }
    //! Returns the number of elements.
    int64_t volume() const noexcept
    {
        return mShape.volume();
    }
    //! Returns volume() times the element size.
    int64_t sizeBytes() const noexcept
    {
        return volume() * dataTypeSize(mDataType);
    }
    //! Returns true when the strides are the row-major strides of the shape (extents of 1 may have any stride).
    bool isContiguous() const noexcept;
    //! Returns a view of the same memory with `shape`; throws InvalidArgumentError unless this view is
    //! contiguous and `shape` has the same volume (no negative extents).
    Tensor reshape(Coords const& shape) const;

private:
    void checkElementSize(int64_t size) const;

    void* mData{nullptr};
    Coords mShape{};
    Coords mStride{};
    DataType mDataType{DataType::kFLOAT};
    DeviceType mDeviceType{DeviceType::kGPU};
};

//! Returns the row-major strides (in elements) of `shape`.
Coords contiguousStrides(Coords const& shape) noexcept;

} // namespace kvcache::rt
