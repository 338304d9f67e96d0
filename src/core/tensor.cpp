#include "kvcache/core/tensor.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

namespace kvcache::rt
{

Coords::Coords(std::initializer_list<int64_t> dims)
{
    if (dims.size() > static_cast<size_t>(kMAX_DIMS))
    {
        throw InvalidArgumentError(
            fmt::format("Coords: {} dimensions given, at most kMAX_DIMS = {} are supported", dims.size(), kMAX_DIMS));
    }
    for (int64_t const dim : dims)
    {
        mDims[static_cast<size_t>(mNumDims++)] = dim;
    }
}

int64_t Coords::operator[](int32_t dim) const
{
    if (dim < 0 || dim >= mNumDims)
    {
        throw OutOfRangeError(fmt::format("Coords: dimension {} is out of range [0, {})", dim, mNumDims));
    }
    return mDims[static_cast<size_t>(dim)];
}

int64_t& Coords::operator[](int32_t dim)
{
    if (dim < 0 || dim >= mNumDims)
    {
        throw OutOfRangeError(fmt::format("Coords: dimension {} is out of range [0, {})", dim, mNumDims));
    }
    return mDims[static_cast<size_t>(dim)];
}

int64_t Coords::volume() const noexcept
{
    int64_t product = 1;
    for (int32_t i = 0; i < mNumDims; ++i)
    {
        product *= mDims[static_cast<size_t>(i)];
    }
    return product;
}

Coords contiguousStrides(Coords const& shape) noexcept
{
    Coords stride = shape;
    int64_t running = 1;
    for (int32_t i = shape.getNumDims() - 1; i >= 0; --i)
    {
        stride[i] = running;
        running *= shape[i];
    }
    return stride;
}

namespace
{
void checkExtents(Coords const& shape)
{
    for (int32_t i = 0; i < shape.getNumDims(); ++i)
    {
        if (shape[i] < 0)
        {
            throw InvalidArgumentError(fmt::format("Tensor: extent {} of dimension {} is negative", shape[i], i));
        }
    }
}
} // namespace

Tensor::Tensor(void* data, Coords const& shape, DataType type, DeviceType device)
    : Tensor(data, shape, contiguousStrides(shape), type, device)
{
}

Tensor::Tensor(void* data, Coords const& shape, Coords const& stride, DataType type, DeviceType device)
    : mData(data)
    , mShape(shape)
    , mStride(stride)
    , mDataType(type)
    , mDeviceType(device)
{
    checkExtents(shape);
    if (stride.getNumDims() != shape.getNumDims())
    {
        throw InvalidArgumentError(
            fmt::format("Tensor: stride has {} dimensions but shape has {}", stride.getNumDims(), shape.getNumDims()));
    }
}

bool Tensor::isContiguous() const noexcept
{
    int64_t running = 1;
    for (int32_t i = mShape.getNumDims() - 1; i >= 0; --i)
    {
        if (mShape[i] != 1 && mStride[i] != running)
        {
            return false;
        }
        running *= mShape[i];
    }
    return true;
}

Tensor Tensor::reshape(Coords const& shape) const
{
    checkExtents(shape);
    if (!isContiguous())
    {
        throw InvalidArgumentError("Tensor::reshape: the view is not contiguous");
    }
    if (shape.volume() != volume())
    {
        throw InvalidArgumentError(fmt::format(
            "Tensor::reshape: new shape has volume {} but the view has volume {}", shape.volume(), volume()));
    }
    return Tensor(mData, shape, mDataType, mDeviceType);
}

void Tensor::checkElementSize(int64_t size) const
{
    if (size != dataTypeSize(mDataType))
    {
        throw InvalidArgumentError(
            fmt::format("Tensor::dataPointer: sizeof(T) is {} but the element type {} has {} bytes", size,
                dataTypeName(mDataType), dataTypeSize(mDataType)));
    }
}

} // namespace kvcache::rt
