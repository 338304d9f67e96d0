#include "cuda_arguments.h"

#include "dlpack.h"

#include <kvcache/core/errors.h>
#include <kvcache/tiers/host_tier.h>

#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <limits>
#include <string>
#include <type_traits>

namespace kvcache::python
{
namespace
{

cudaStream_t handleOf(nb::handle value, char const* source)
{
    if (!PyLong_Check(value.ptr()))
    {
        throw nb::type_error(fmt::format("{} is a {}; expected an int stream handle", source, typeName(value)).c_str());
    }
    uintptr_t handle = 0;
    if (!nb::try_cast<uintptr_t>(value, handle))
    {
        throw rt::InvalidArgumentError(fmt::format("{} is {}; a stream handle must fit in [0, {}]", source,
            nb::str(value).c_str(), std::numeric_limits<uintptr_t>::max()));
    }
    return reinterpret_cast<cudaStream_t>(handle);
}

bool isRowMajor(int32_t ndim, int64_t const* shape, int64_t const* strides)
{
    if (strides == nullptr)
    {
        return true;
    }
    int64_t expected = 1;
    for (int32_t i = ndim - 1; i >= 0; --i)
    {
        if (shape[i] != 1 && strides[i] != expected)
        {
            return false;
        }
        expected *= shape[i];
    }
    return true;
}

std::optional<DeviceInt32Array> fromDLPack(nb::handle list, cudaStream_t consumer, int32_t device, char const* what)
{
    nb::object const streamArg = nb::int_(dlpackStreamArgument(consumer));
    nb::object capsule;
    try
    {
        capsule = list.attr("__dlpack__")(nb::arg("stream") = streamArg, nb::arg("max_version") = nb::make_tuple(1, 1));
    }
    catch (nb::python_error& error)
    {
        // Producers older than DLPack 1.0 take no max_version.
        if (!error.matches(PyExc_TypeError))
        {
            throw;
        }
        capsule = list.attr("__dlpack__")(nb::arg("stream") = streamArg);
    }
    DLTensor const* dl = nullptr;
    if (PyCapsule_IsValid(capsule.ptr(), kCAPSULE_VERSIONED))
    {
        dl =
            &static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), kCAPSULE_VERSIONED))->dl_tensor;
    }
    else if (PyCapsule_IsValid(capsule.ptr(), kCAPSULE_LEGACY))
    {
        dl = &static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCAPSULE_LEGACY))->dl_tensor;
    }
    else
    {
        throw rt::InvalidArgumentError(fmt::format("{}: __dlpack__ returned no unused DLPack capsule", what));
    }
    if (dl->dtype.code != kDLInt || dl->dtype.bits != 32 || dl->dtype.lanes != 1)
    {
        throw rt::InvalidArgumentError(fmt::format("{} has DLPack dtype (code {}, bits {}, lanes {}); it must be "
                                                   "int32 (code {}, bits 32, lanes 1)",
            what, dl->dtype.code, dl->dtype.bits, dl->dtype.lanes, static_cast<int32_t>(kDLInt)));
    }
    int32_t const deviceType = dl->device.device_type;
    if ((deviceType == kDLCUDA || deviceType == kDLCUDAManaged) && dl->device.device_id != device)
    {
        throw rt::InvalidArgumentError(fmt::format(
            "{} lives on CUDA device {}; the cache lives on device {}", what, dl->device.device_id, device));
    }
    if (!isRowMajor(dl->ndim, dl->shape, dl->strides))
    {
        throw rt::InvalidArgumentError(fmt::format("{} is not contiguous; pass a contiguous int32 array", what));
    }
    int64_t count = 1;
    for (int32_t i = 0; i < dl->ndim; ++i)
    {
        count *= dl->shape[i];
    }
    // The capsule's deleter runs when it goes: the caller's object still owns the memory.
    return DeviceInt32Array{reinterpret_cast<int32_t*>(static_cast<char*>(dl->data) + dl->byte_offset), count};
}

std::optional<DeviceInt32Array> fromCudaArrayInterface(
    nb::handle list, cudaStream_t consumer, int32_t device, char const* what)
{
    std::string const field = fmt::format("{}.__cuda_array_interface__", what);
    nb::dict const cai = checkedCast<nb::dict>(list.attr("__cuda_array_interface__"), field.c_str(), "a dict");
    std::string const typestr = checkedCast<nb::str>(cai["typestr"], (field + "['typestr']").c_str(), "a str").c_str();
    if (typestr != "<i4" && typestr != "|i4" && typestr != "=i4")
    {
        throw rt::InvalidArgumentError(
            fmt::format("{} has typestr '{}' in __cuda_array_interface__; it must be int32 ('<i4')", what, typestr));
    }
    nb::tuple const shapeTuple = checkedCast<nb::tuple>(cai["shape"], (field + "['shape']").c_str(), "a tuple");
    std::vector<int64_t> shape;
    int64_t count = 1;
    for (nb::handle extent : shapeTuple)
    {
        shape.push_back(intArgument(extent, (field + "['shape'] entry").c_str()));
        count *= shape.back();
    }
    if (cai.contains("strides") && !cai["strides"].is_none())
    {
        std::vector<int64_t> strides;
        for (nb::handle stride : checkedCast<nb::tuple>(cai["strides"], (field + "['strides']").c_str(), "a tuple"))
        {
            // The interface gives strides in bytes.
            strides.push_back(
                intArgument(stride, (field + "['strides'] entry").c_str()) / static_cast<int64_t>(sizeof(int32_t)));
        }
        if (!isRowMajor(static_cast<int32_t>(shape.size()), shape.data(), strides.data()))
        {
            throw rt::InvalidArgumentError(fmt::format("{} is not contiguous; pass a contiguous int32 array", what));
        }
    }
    nb::tuple const dataField = checkedCast<nb::tuple>(cai["data"], (field + "['data']").c_str(), "a tuple");
    auto* const data =
        reinterpret_cast<int32_t*>(static_cast<uintptr_t>(intArgument(dataField[0], (field + "['data'][0]").c_str())));
    if (data != nullptr)
    {
        cudaPointerAttributes attributes{};
        KVCACHE_CUDA_TRY(cudaPointerGetAttributes(&attributes, data));
        if (attributes.type == cudaMemoryTypeDevice && attributes.device != device)
        {
            throw rt::InvalidArgumentError(fmt::format(
                "{} lives on CUDA device {}; the cache lives on device {}", what, attributes.device, device));
        }
    }
    if (cai.contains("stream") && !cai["stream"].is_none())
    {
        int64_t const producerValue = intArgument(cai["stream"], (field + "['stream']").c_str());
        cudaStream_t const producer = producerValue == 1 ? cudaStreamLegacy
            : producerValue == 2                         ? cudaStreamPerThread
                                 : reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(producerValue));
        if (producer != consumer)
        {
            cudaEvent_t event = nullptr;
            KVCACHE_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
            cudaError_t status = cudaEventRecord(event, producer);
            if (status == cudaSuccess)
            {
                status = cudaStreamWaitEvent(consumer, event, 0);
            }
            KVCACHE_CUDA_LOG(cudaEventDestroy(event));
            KVCACHE_CUDA_TRY(status);
        }
    }
    return DeviceInt32Array{data, count};
}

//! The argument a host list came as, for messages: its name and what its entries are (plural).
struct ListName
{
    char const* what;
    char const* noun;
};

template <typename T>
int32_t entryToInt32(T value, ListName name, size_t index)
{
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
    {
        throw rt::InvalidArgumentError(
            fmt::format("{}[{}] is {}; {} must fit in int32 [{}, {}]", name.what, index, static_cast<int64_t>(value),
                name.noun, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
    }
    return static_cast<int32_t>(value);
}

int32_t objectToInt32(nb::handle item, ListName name, size_t index)
{
    int64_t value = 0;
    if (!nb::try_cast<int64_t>(item, value))
    {
        if (PyIndex_Check(item.ptr()))
        {
            throw rt::InvalidArgumentError(
                fmt::format("{}[{}] is {}; {} must fit in int32 [{}, {}]", name.what, index, nb::str(item).c_str(),
                    name.noun, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
        }
        throw nb::type_error(
            fmt::format("{}[{}] is a {}; {} must be ints", name.what, index, typeName(item), name.noun).c_str());
    }
    return entryToInt32(value, name, index);
}

} // namespace

std::string typeName(nb::handle object)
{
    return nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(object.ptr()))).attr("__name__")).c_str();
}

void throwTypeError(nb::handle value, char const* field, char const* expected)
{
    throw nb::type_error(fmt::format("{} is a {}; expected {}", field, typeName(value), expected).c_str());
}

int64_t intArgument(nb::handle value, char const* field)
{
    int64_t result = 0;
    if (nb::try_cast<int64_t>(value, result))
    {
        return result;
    }
    if (PyIndex_Check(value.ptr()))
    {
        throw rt::InvalidArgumentError(fmt::format("{} is {}; it must fit in int64 [{}, {}]", field,
            nb::str(value).c_str(), std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    }
    throwTypeError(value, field, "an int");
}

void requireIterable(nb::handle value, char const* field, char const* expected)
{
    if (!nb::hasattr(value, "__iter__"))
    {
        throwTypeError(value, field, expected);
    }
}

std::string bytesArgument(nb::handle value, char const* field, char const* expected)
{
    nb::bytes const bytes = checkedCast<nb::bytes>(value, field, expected);
    return std::string(bytes.c_str(), bytes.size());
}

int32_t toInt32(int64_t value, char const* field)
{
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
    {
        throw rt::InvalidArgumentError(fmt::format("{} is {}; it must fit in int32 [{}, {}]", field, value,
            std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
    }
    return static_cast<int32_t>(value);
}

cudaStream_t streamArgument(nb::handle stream, cudaStream_t fallback)
{
    if (stream.is_none())
    {
        return fallback;
    }
    if (PyLong_Check(stream.ptr()))
    {
        return handleOf(stream, "stream");
    }
    if (nb::hasattr(stream, "__cuda_stream__"))
    {
        nb::object const protocol = stream.attr("__cuda_stream__")();
        return handleOf(checkedCast<nb::tuple>(protocol, "stream.__cuda_stream__()", "a (version, handle) tuple")[1],
            "stream.__cuda_stream__()[1]");
    }
    if (nb::hasattr(stream, "cuda_stream"))
    {
        return handleOf(stream.attr("cuda_stream"), "stream.cuda_stream");
    }
    throw nb::type_error(fmt::format("stream is a {}; expected None, an int handle, or an object with "
                                     "__cuda_stream__ or cuda_stream",
        typeName(stream))
                             .c_str());
}

int64_t dlpackStreamArgument(cudaStream_t stream) noexcept
{
    if (stream == nullptr || stream == cudaStreamLegacy)
    {
        return 1;
    }
    if (stream == cudaStreamPerThread)
    {
        return 2;
    }
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(stream));
}

std::optional<DeviceInt32Array> deviceInt32Array(
    nb::handle list, cudaStream_t consumer, int32_t device, char const* what)
{
    if (nb::hasattr(list, "__dlpack_device__"))
    {
        std::string const field = fmt::format("{}.__dlpack_device__()", what);
        nb::tuple const where =
            checkedCast<nb::tuple>(list.attr("__dlpack_device__")(), field.c_str(), "a (type, id) tuple");
        int64_t const type = intArgument(where[0], (field + "[0]").c_str());
        if (type == kDLCUDA || type == kDLCUDAManaged || type == kDLCUDAHost)
        {
            return fromDLPack(list, consumer, device, what);
        }
        return std::nullopt;
    }
    if (nb::hasattr(list, "__cuda_array_interface__"))
    {
        return fromCudaArrayInterface(list, consumer, device, what);
    }
    return std::nullopt;
}

template <typename Pair>
void hostInt32Pairs(nb::handle list, std::vector<Pair>& pairs, PairListName name)
{
    static_assert(std::is_standard_layout_v<Pair> && sizeof(Pair) == 2 * sizeof(int32_t),
        "a pair is two int32 fields: an int32 [n, 2] row's layout");
    pairs.clear();
    ListName const entries{name.what, name.noun};
    using Int32Pairs = nb::ndarray<int32_t const, nb::shape<-1, 2>, nb::c_contig, nb::device::cpu>;
    using Int64Pairs = nb::ndarray<int64_t const, nb::shape<-1, 2>, nb::c_contig, nb::device::cpu>;
    Int32Pairs int32Pairs;
    if (nb::try_cast(list, int32Pairs, false))
    {
        // Two int32 a row are the pair's layout.
        auto const* const first = reinterpret_cast<Pair const*>(int32Pairs.data());
        pairs.assign(first, first + int32Pairs.shape(0));
        return;
    }
    Int64Pairs int64Pairs;
    if (nb::try_cast(list, int64Pairs, false))
    {
        pairs.reserve(int64Pairs.shape(0));
        for (size_t i = 0; i < int64Pairs.shape(0); ++i)
        {
            pairs.push_back({entryToInt32(int64Pairs(i, 0), entries, i), entryToInt32(int64Pairs(i, 1), entries, i)});
        }
        return;
    }
    if (!nb::isinstance<nb::sequence>(list) && !nb::hasattr(list, "__iter__"))
    {
        throw nb::type_error(
            fmt::format("{} is a {}; expected a sequence of {} pairs, an [n, 2] int array or a device array", name.what,
                typeName(list), name.pair)
                .c_str());
    }
    size_t index = 0;
    for (nb::handle pair : list)
    {
        nb::sequence const entry = nb::borrow<nb::sequence>(pair);
        if (!nb::isinstance<nb::sequence>(pair) || nb::len(entry) != 2)
        {
            throw rt::InvalidArgumentError(
                fmt::format("{}[{}] is a {}; expected a {} pair", name.what, index, typeName(pair), name.pair));
        }
        pairs.push_back({objectToInt32(entry[0], entries, index), objectToInt32(entry[1], entries, index)});
        ++index;
    }
}

template void hostInt32Pairs<rt::PageCopy>(nb::handle, std::vector<rt::PageCopy>&, PairListName);
template void hostInt32Pairs<rt::HostTierEntry>(nb::handle, std::vector<rt::HostTierEntry>&, PairListName);
template void hostInt32Pairs<rt::StateSlotCopy>(nb::handle, std::vector<rt::StateSlotCopy>&, PairListName);
template void hostInt32Pairs<rt::HostStateEntry>(nb::handle, std::vector<rt::HostStateEntry>&, PairListName);

void hostPagePairs(nb::handle list, std::vector<rt::PageCopy>& pairs)
{
    hostInt32Pairs(list, pairs, PairListName{"pairs", "page ids", "(src, dst)"});
}

int32_t* deviceScalar(nb::handle value, cudaStream_t stream, int32_t device, char const* what)
{
    if (value.is_none())
    {
        return nullptr;
    }
    std::optional<DeviceInt32Array> const array = deviceInt32Array(value, stream, device, what);
    if (!array || array->count != 1)
    {
        throw rt::InvalidArgumentError(fmt::format("{} must be a device int32 array of one element ({})", what,
            array ? fmt::format("it has {}", array->count) : std::string("it is not in device memory")));
    }
    return array->data;
}

void requireHostListArguments(nb::handle count, nb::handle errorCount, char const* list)
{
    if (!count.is_none() || !errorCount.is_none())
    {
        throw rt::InvalidArgumentError(
            fmt::format("count and error_count are device int32 scalars for device lists; {} is a host list", list));
    }
}

void hostPageIds(nb::handle list, std::vector<int32_t>& pages)
{
    hostInt32s(list, pages, "pages", "page ids");
}

void hostInt32s(nb::handle list, std::vector<int32_t>& values, char const* what, char const* noun)
{
    values.clear();
    ListName const name{what, noun};
    using Int32Ids = nb::ndarray<int32_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    using Int64Ids = nb::ndarray<int64_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    Int32Ids int32Ids;
    if (nb::try_cast(list, int32Ids, false))
    {
        values.assign(int32Ids.data(), int32Ids.data() + int32Ids.shape(0));
        return;
    }
    Int64Ids int64Ids;
    if (nb::try_cast(list, int64Ids, false))
    {
        values.reserve(int64Ids.shape(0));
        for (size_t i = 0; i < int64Ids.shape(0); ++i)
        {
            values.push_back(entryToInt32(int64Ids(i), name, i));
        }
        return;
    }
    if (!nb::hasattr(list, "__iter__"))
    {
        throw nb::type_error(fmt::format(
            "{} is a {}; expected a sequence of ints, a 1-D int array or a device array", what, typeName(list))
                                 .c_str());
    }
    size_t index = 0;
    for (nb::handle value : list)
    {
        values.push_back(objectToInt32(value, name, index));
        ++index;
    }
}

std::string pathArgument(nb::handle path, char const* field)
{
    nb::object const fsPath = nb::steal(PyOS_FSPath(path.ptr()));
    if (!fsPath.is_valid())
    {
        PyErr_Clear();
        throwTypeError(path, field, "a str or an os.PathLike");
    }
    if (!nb::isinstance<nb::str>(fsPath))
    {
        throwTypeError(fsPath, field, "a str (a bytes path is not taken)");
    }
    Py_ssize_t bytes = 0;
    char const* const utf8 = PyUnicode_AsUTF8AndSize(fsPath.ptr(), &bytes);
    if (utf8 == nullptr)
    {
        throw nb::python_error();
    }
    std::string const result(utf8, static_cast<size_t>(bytes));
    if (result.find('\0') != std::string::npos)
    {
        throw rt::InvalidArgumentError(std::string(field) + " contains a NUL character");
    }
    return result;
}

} // namespace kvcache::python
