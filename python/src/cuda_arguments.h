#pragma once

#include <kvcache/memory/page_ops.h>

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace kvcache::python
{

namespace nb = nanobind;

//! Returns `value` as int32; throws InvalidArgumentError naming `field`, the value and the int32 range otherwise.
int32_t toInt32(int64_t value, char const* field);

//! Returns the name of the Python type of `object` (for messages).
std::string typeName(nb::handle object);

//! Throws TypeError: "`field` is a <type of value>; expected `expected`".
[[noreturn]] void throwTypeError(nb::handle value, char const* field, char const* expected);

//! Returns `value` (an int or an object with __index__) as int64. Throws TypeError naming `field` for anything else,
//! InvalidArgumentError naming `field`, the value and the int64 range for an int outside it.
int64_t intArgument(nb::handle value, char const* field);

//! Returns `value` converted to T (a bound type or a nanobind object type) without the failing cast's
//! std::bad_cast: throws TypeError naming `field`, the type it got and `expected` when `value` is not one.
template <typename T>
T checkedCast(nb::handle value, char const* field, char const* expected)
{
    T result{};
    // A pointer cast takes None as null: no caller wants that.
    if ((std::is_pointer_v<T> && value.is_none()) || !nb::try_cast<T>(value, result))
    {
        throwTypeError(value, field, expected);
    }
    return result;
}

//! Returns normally when `value` is iterable; throws TypeError naming `field` and `expected` otherwise.
void requireIterable(nb::handle value, char const* field, char const* expected);

//! Returns the path `path` names: a str or an os.PathLike giving one. Throws TypeError naming `field` otherwise and
//! InvalidArgumentError for a NUL character.
std::string pathArgument(nb::handle path, char const* field);

//! Returns the contents of `value`, which must be bytes; throws TypeError naming `field` and `expected` otherwise.
std::string bytesArgument(nb::handle value, char const* field, char const* expected);

//! Returns the stream `stream` names: `fallback` for None, the handle of an int, of an object's __cuda_stream__()
//! (the CUDA stream protocol's (version, handle)) or of its `cuda_stream` attribute (torch.cuda.Stream). Throws
//! TypeError for anything else.
cudaStream_t streamArgument(nb::handle stream, cudaStream_t fallback);

//! Returns the int a producer's __dlpack__(stream=...) takes for `stream` (1 for the legacy default stream, 2 for the
//! per-thread default stream, else the handle).
int64_t dlpackStreamArgument(cudaStream_t stream) noexcept;

//! A contiguous int32 array in memory the device can read.
struct DeviceInt32Array
{
    int32_t* data = nullptr;
    //! Elements.
    int64_t count = 0;
};

//! Returns `list` as a device array when it is one: an object whose __dlpack_device__ is CUDA (device `device`),
//! CUDA-managed or CUDA-pinned host memory, or one with __cuda_array_interface__; nullopt for host objects (lists,
//! NumPy arrays). The producer orders its writes before `consumer` (DLPack's stream argument, or the interface's
//! stream by an event). Throws InvalidArgumentError, naming `what`, for an element type other than int32, a
//! non-contiguous array or one on another device.
std::optional<DeviceInt32Array> deviceInt32Array(
    nb::handle list, cudaStream_t consumer, int32_t device, char const* what);

//! How messages about a host list of pairs name it: the argument, its entries (plural) and the form of a pair.
struct PairListName
{
    char const* what;
    char const* noun;
    char const* pair;
};

//! Reads host pairs into `pairs` (Pair: two int32 fields, rt::PageCopy, rt::HostTierEntry, rt::StateSlotCopy or
//! rt::HostStateEntry): an int32 or int64 array of shape [n, 2] (NumPy, or anything nanobind takes as a CPU ndarray)
//! or a sequence of pairs. Throws InvalidArgumentError / TypeError naming the argument and the entry as `name` says
//! (e.g. {"entries", "ids", "(page, host_page)"}).
template <typename Pair>
void hostInt32Pairs(nb::handle list, std::vector<Pair>& pairs, PairListName name);

//! Reads host page pairs into `pairs`: an int32 or int64 array of shape [n, 2] (NumPy, or anything nanobind takes as
//! a CPU ndarray) or a sequence of (src, dst) pairs. Throws InvalidArgumentError / TypeError naming the entry.
void hostPagePairs(nb::handle list, std::vector<rt::PageCopy>& pairs);

//! Returns the data of `value`, a device int32 array of one element (a count or an error counter of a device-list
//! call), or null for None. Throws InvalidArgumentError naming `what` for anything else.
int32_t* deviceScalar(nb::handle value, cudaStream_t stream, int32_t device, char const* what);

//! Throws InvalidArgumentError unless count and error_count are None: they are device scalars for device lists, and
//! `list` (its name) is a host list.
void requireHostListArguments(nb::handle count, nb::handle errorCount, char const* list);

//! Reads host page ids into `pages`: a one-dimensional int32 or int64 array or a sequence of ints. Throws
//! InvalidArgumentError / TypeError naming the entry of `pages`.
void hostPageIds(nb::handle list, std::vector<int32_t>& pages);

//! Reads host int32 values into `values` as hostPageIds does; messages name the argument `what` and its entries as
//! `noun` (e.g. "tokens", "token ids").
void hostInt32s(nb::handle list, std::vector<int32_t>& values, char const* what, char const* noun);

} // namespace kvcache::python
