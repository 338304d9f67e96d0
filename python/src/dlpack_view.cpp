#include "dlpack_view.h"

#include "core/scoped_device.h"
#include "cuda_arguments.h"

#include <kvcache/core/errors.h>

#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

namespace kvcache::python
{
namespace
{

[[noreturn]] void throwBufferError(std::string const& message)
{
    PyErr_SetString(PyExc_BufferError, message.c_str());
    throw nb::python_error();
}

//! One exported tensor: the managed struct the consumer sees, the shape and strides it points at, and the reference
//! to the owner that keeps the memory alive until the consumer calls the deleter.
template <typename Managed>
struct Export
{
    Managed managed{};
    std::array<int64_t, rt::Coords::kMAX_DIMS> shape{};
    std::array<int64_t, rt::Coords::kMAX_DIMS> strides{};
    PyObject* owner = nullptr;
};

template <typename Managed>
constexpr char const* capsuleName() noexcept
{
    if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>)
    {
        return kCAPSULE_VERSIONED;
    }
    else
    {
        return kCAPSULE_LEGACY;
    }
}

// Consumers may drop their tensor on any thread, with or without the GIL. While the interpreter finalizes (it clears
// the modules' globals, which may hold a capsule or a consumer's tensor), Py_IsInitialized() is already false but the
// finalizing thread holds the GIL: the reference is dropped there, so the owner goes with the modules. Any other thread
// after that point leaves it: the process is ending.
void releaseOwner(PyObject* owner) noexcept
{
    if (owner == nullptr)
    {
        return;
    }
    if (PyGILState_Check())
    {
        Py_DECREF(owner);
        return;
    }
    if (!Py_IsInitialized())
    {
        return;
    }
    PyGILState_STATE const state = PyGILState_Ensure();
    Py_DECREF(owner);
    PyGILState_Release(state);
}

template <typename Managed>
void deleteExport(Managed* self) noexcept
{
    auto* const exported = static_cast<Export<Managed>*>(self->manager_ctx);
    PyObject* const owner = exported->owner;
    delete exported;
    releaseOwner(owner);
}

// A capsule no consumer took (its name unchanged) still owns its tensor.
template <typename Managed>
void destroyCapsule(PyObject* capsule) noexcept
{
    char const* const name = capsuleName<Managed>();
    if (PyCapsule_IsValid(capsule, name))
    {
        auto* const managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule, name));
        managed->deleter(managed);
    }
}

bool isCapturing(cudaStream_t stream)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    KVCACHE_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
    return status != cudaStreamCaptureStatusNone;
}

template <typename T>
nb::tuple toTuple(T const* values, int32_t count)
{
    nb::list list;
    for (int32_t i = 0; i < count; ++i)
    {
        list.append(values[i]);
    }
    return nb::tuple(list);
}

} // namespace

void StreamOrder::orderBefore(cudaStream_t consumer) const
{
    if (consumer == producer || event == nullptr)
    {
        return;
    }
    rt::detail::ScopedDevice const scoped(device);
    // An event recorded outside a capture cannot be waited on inside it (and the reverse): a capture orders its
    // nodes itself, and the caller orders the capture after earlier work when it begins it.
    if (isCapturing(producer) || isCapturing(consumer))
    {
        return;
    }
    KVCACHE_CUDA_TRY(cudaEventRecord(event, producer));
    KVCACHE_CUDA_TRY(cudaStreamWaitEvent(consumer, event, 0));
}

DLDataType dlpackDataType(rt::DataType type)
{
    switch (type)
    {
    case rt::DataType::kFLOAT: return {kDLFloat, 32, 1};
    case rt::DataType::kHALF: return {kDLFloat, 16, 1};
    case rt::DataType::kBF16: return {kDLBfloat, 16, 1};
    case rt::DataType::kFP8_E4M3: return {kDLFloat8_e4m3fn, 8, 1};
    case rt::DataType::kFP8_E5M2: return {kDLFloat8_e5m2, 8, 1};
    case rt::DataType::kINT8: return {kDLInt, 8, 1};
    case rt::DataType::kUINT8: return {kDLUInt, 8, 1};
    case rt::DataType::kINT32: return {kDLInt, 32, 1};
    case rt::DataType::kINT64: return {kDLInt, 64, 1};
    }
    throw rt::InvalidArgumentError(
        fmt::format("data type value {} is outside the DataType enumeration [0, 8]", static_cast<int32_t>(type)));
}

cudaStream_t dlpackConsumerStream(int64_t stream)
{
    if (stream == 0 || stream < -1)
    {
        throw rt::InvalidArgumentError(fmt::format("__dlpack__ stream is {}; a CUDA consumer passes -1 (no "
                                                   "synchronisation), 1 (legacy default stream), 2 (per-thread "
                                                   "default stream) or a stream handle above 2",
            stream));
    }
    if (stream == 1)
    {
        return cudaStreamLegacy;
    }
    if (stream == 2)
    {
        return cudaStreamPerThread;
    }
    return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
}

DLPackView::DLPackView(
    rt::Tensor const& tensor, DLDeviceType deviceType, int32_t deviceId, StreamOrder const* order, nb::object owner)
    : mData(tensor.rawPointer())
    , mNdim(tensor.getShape().getNumDims())
    , mDataType(tensor.getDataType())
    , mDevice{deviceType, deviceId}
    , mOrder(order)
    , mOwner(std::move(owner))
{
    for (int32_t i = 0; i < mNdim; ++i)
    {
        mShape[static_cast<size_t>(i)] = tensor.getShape()[i];
        mStrides[static_cast<size_t>(i)] = tensor.getStride()[i];
    }
}

nb::object DLPackView::exportCapsule(
    nb::handle stream, nb::handle maxVersion, nb::handle dlDevice, nb::handle copy) const
{
    if (!copy.is_none() && checkedCast<bool>(copy, "__dlpack__ copy", "a bool or None"))
    {
        throwBufferError("__dlpack__(copy=True): kvcache views are zero-copy; copy the consumer's tensor instead");
    }
    if (!dlDevice.is_none())
    {
        nb::tuple const wanted = checkedCast<nb::tuple>(dlDevice, "__dlpack__ dl_device", "a (type, id) tuple");
        if (wanted.size() != 2)
        {
            throw rt::InvalidArgumentError(
                fmt::format("__dlpack__ dl_device has {} entries; expected (type, id)", wanted.size()));
        }
        int64_t const type = intArgument(wanted[0], "__dlpack__ dl_device[0]");
        int64_t const id = intArgument(wanted[1], "__dlpack__ dl_device[1]");
        if (type != mDevice.device_type || id != mDevice.device_id)
        {
            throwBufferError(
                fmt::format("__dlpack__ dl_device is ({}, {}); the view lives on ({}, {}) and is not copied", type, id,
                    static_cast<int32_t>(mDevice.device_type), mDevice.device_id));
        }
    }
    if (mDevice.device_type == kDLCPU)
    {
        if (!stream.is_none() && intArgument(stream, "__dlpack__ stream") != -1)
        {
            throwBufferError("__dlpack__ stream must be None for a CPU view");
        }
    }
    else
    {
        // No stream means the legacy default stream (DLPack's rule for CUDA consumers).
        int64_t const consumer = stream.is_none() ? 1 : intArgument(stream, "__dlpack__ stream");
        cudaStream_t const consumerStream = dlpackConsumerStream(consumer);
        if (consumer != -1 && mOrder != nullptr)
        {
            mOrder->orderBefore(consumerStream);
        }
    }

    bool versioned = false;
    if (!maxVersion.is_none())
    {
        nb::tuple const version =
            checkedCast<nb::tuple>(maxVersion, "__dlpack__ max_version", "a (major, minor) tuple or None");
        versioned = version.size() > 0 && intArgument(version[0], "__dlpack__ max_version[0]") >= 1;
    }

    auto fill = [this](auto& exported)
    {
        exported.shape = mShape;
        exported.strides = mStrides;
        DLTensor& dl = exported.managed.dl_tensor;
        dl.data = mData;
        dl.device = mDevice;
        dl.ndim = mNdim;
        dl.dtype = dlpackDataType(mDataType);
        dl.shape = exported.shape.data();
        dl.strides = exported.strides.data();
        dl.byte_offset = 0;
        exported.managed.manager_ctx = &exported;
    };
    auto wrap = [this](auto* exported, auto destructor, char const* name)
    {
        Py_INCREF(mOwner.ptr());
        exported->owner = mOwner.ptr();
        PyObject* const capsule = PyCapsule_New(&exported->managed, name, destructor);
        if (capsule == nullptr)
        {
            exported->managed.deleter(&exported->managed);
            throw nb::python_error();
        }
        return nb::steal(capsule);
    };
    if (versioned)
    {
        auto* const exported = new Export<DLManagedTensorVersioned>();
        fill(*exported);
        exported->managed.version = kDLPACK_VERSION;
        exported->managed.flags = 0;
        exported->managed.deleter = &deleteExport<DLManagedTensorVersioned>;
        return wrap(exported, &destroyCapsule<DLManagedTensorVersioned>, kCAPSULE_VERSIONED);
    }
    auto* const exported = new Export<DLManagedTensor>();
    fill(*exported);
    exported->managed.deleter = &deleteExport<DLManagedTensor>;
    return wrap(exported, &destroyCapsule<DLManagedTensor>, kCAPSULE_LEGACY);
}

nb::tuple DLPackView::device() const
{
    return nb::make_tuple(static_cast<int32_t>(mDevice.device_type), mDevice.device_id);
}

nb::tuple DLPackView::shape() const
{
    return toTuple(mShape.data(), mNdim);
}

nb::tuple DLPackView::strides() const
{
    return toTuple(mStrides.data(), mNdim);
}

int64_t DLPackView::nbytes() const noexcept
{
    int64_t elements = 1;
    for (int32_t i = 0; i < mNdim; ++i)
    {
        elements *= mShape[static_cast<size_t>(i)];
    }
    return elements * rt::dataTypeSize(mDataType);
}

namespace
{

//! Reads a capsule's DLTensor without taking it: what a consumer would see.
nb::dict describeCapsule(nb::capsule capsule)
{
    nb::dict result;
    char const* const name = PyCapsule_GetName(capsule.ptr());
    if (name == nullptr)
    {
        throw nb::python_error();
    }
    std::string const capsuleName(name);
    DLTensor const* dl = nullptr;
    if (capsuleName == kCAPSULE_VERSIONED)
    {
        auto const* managed =
            static_cast<DLManagedTensorVersioned const*>(PyCapsule_GetPointer(capsule.ptr(), kCAPSULE_VERSIONED));
        result["version"] = nb::make_tuple(managed->version.major, managed->version.minor);
        result["flags"] = managed->flags;
        result["has_deleter"] = managed->deleter != nullptr;
        dl = &managed->dl_tensor;
    }
    else if (capsuleName == kCAPSULE_LEGACY)
    {
        auto const* managed = static_cast<DLManagedTensor const*>(PyCapsule_GetPointer(capsule.ptr(), kCAPSULE_LEGACY));
        result["has_deleter"] = managed->deleter != nullptr;
        dl = &managed->dl_tensor;
    }
    else
    {
        throw rt::InvalidArgumentError(fmt::format("capsule name is '{}'; expected '{}' or '{}' (an unused capsule)",
            capsuleName, kCAPSULE_LEGACY, kCAPSULE_VERSIONED));
    }
    result["name"] = capsuleName;
    result["data"] = reinterpret_cast<uintptr_t>(dl->data);
    result["device"] = nb::make_tuple(static_cast<int32_t>(dl->device.device_type), dl->device.device_id);
    result["ndim"] = dl->ndim;
    result["dtype"] = nb::make_tuple(dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
    result["shape"] = toTuple(dl->shape, dl->ndim);
    result["strides"] = dl->strides == nullptr ? nb::object(nb::none()) : nb::object(toTuple(dl->strides, dl->ndim));
    result["byte_offset"] = dl->byte_offset;
    return result;
}

rt::Coords coordsOf(std::vector<int64_t> const& values, char const* field)
{
    if (values.size() > static_cast<size_t>(rt::Coords::kMAX_DIMS))
    {
        throw rt::InvalidArgumentError(
            fmt::format("{} has {} entries; the limit is {}", field, values.size(), rt::Coords::kMAX_DIMS));
    }
    // Coords is built from an initializer list: make one of the right rank, then fill it.
    rt::Coords coords;
    switch (values.size())
    {
    case 0: coords = rt::Coords{}; break;
    case 1: coords = rt::Coords{0}; break;
    case 2: coords = rt::Coords{0, 0}; break;
    case 3: coords = rt::Coords{0, 0, 0}; break;
    case 4: coords = rt::Coords{0, 0, 0, 0}; break;
    case 5: coords = rt::Coords{0, 0, 0, 0, 0}; break;
    case 6: coords = rt::Coords{0, 0, 0, 0, 0, 0}; break;
    case 7: coords = rt::Coords{0, 0, 0, 0, 0, 0, 0}; break;
    default: coords = rt::Coords{0, 0, 0, 0, 0, 0, 0, 0}; break;
    }
    for (size_t i = 0; i < values.size(); ++i)
    {
        coords[static_cast<int32_t>(i)] = values[i];
    }
    return coords;
}

} // namespace

void bindViews(nb::module_& m)
{
    nb::class_<DLPackView>(m, "View",
        "A zero-copy view of kvcache memory implementing the DLPack protocol (torch.from_dlpack, cupy.from_dlpack, "
        "numpy.from_dlpack for host memory). It keeps the memory's owner alive, and so does every tensor made from it.")
        .def("__dlpack__", &DLPackView::exportCapsule, nb::kw_only(), nb::arg("stream") = nb::none(),
            nb::arg("max_version") = nb::none(), nb::arg("dl_device") = nb::none(), nb::arg("copy") = nb::none(),
            nb::sig("def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None, "
                    "dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> typing.Any"),
            "Exports a DLPack capsule; `stream` is the consumer's stream, ordered after the cache's work by an event.")
        .def("__dlpack_device__", &DLPackView::device, "Returns (DLPack device type, device id).")
        .def_prop_ro("data_ptr", &DLPackView::dataPtr, "Address of element (0, ..., 0).")
        .def_prop_ro("shape", &DLPackView::shape, "Extents.")
        .def_prop_ro("strides", &DLPackView::strides, "Strides in elements.")
        .def_prop_ro("dtype", &DLPackView::dataType, "Element type.")
        .def_prop_ro("ndim", &DLPackView::ndim, "Number of dimensions.")
        .def_prop_ro("nbytes", &DLPackView::nbytes, "Bytes the view spans.")
        .def_prop_ro("owner", &DLPackView::owner, "The object that owns the memory.")
        .def("__repr__",
            [](DLPackView const& view)
            {
                std::string shape;
                nb::tuple const extents = view.shape();
                for (size_t i = 0; i < extents.size(); ++i)
                {
                    shape += (i == 0 ? "" : ", ") + std::to_string(nb::cast<int64_t>(extents[i]));
                }
                return fmt::format("View(shape=[{}], dtype={}, data_ptr=0x{:x})", shape,
                    rt::dataTypeName(view.dataType()), view.dataPtr());
            });

    m.def(
        "_dlpack_dtype",
        [](rt::DataType type)
        {
            DLDataType const dl = dlpackDataType(type);
            return nb::make_tuple(dl.code, dl.bits, dl.lanes);
        },
        nb::arg("dtype"), "Returns the DLPack (type code, bits, lanes) a view of `dtype` exports.");
    m.def("_describe_capsule", &describeCapsule, nb::arg("capsule"),
        "Returns the fields of an unused DLPack capsule's tensor without taking it (for tests).");
    m.def(
        "_view_of_buffer",
        [](uintptr_t address, std::vector<int64_t> const& shape, std::vector<int64_t> const& strides, rt::DataType type,
            nb::object owner)
        {
            if (strides.size() != shape.size())
            {
                throw rt::InvalidArgumentError(
                    fmt::format("strides has {} entries; shape has {}", strides.size(), shape.size()));
            }
            rt::Tensor const tensor(reinterpret_cast<void*>(address), coordsOf(shape, "shape"),
                coordsOf(strides, "strides"), type, rt::DeviceType::kCPU);
            return DLPackView(tensor, kDLCPU, 0, nullptr, std::move(owner));
        },
        nb::arg("address"), nb::arg("shape"), nb::arg("strides"), nb::arg("dtype"), nb::arg("owner"),
        "Returns a View of host memory at `address` owned by `owner` (for tests of the DLPack export without a GPU).");
}

} // namespace kvcache::python
