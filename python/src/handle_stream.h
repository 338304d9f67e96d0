#pragma once

#include "dlpack_view.h"

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>

#include <cstdint>

namespace kvcache::python
{

namespace nb = nanobind;

//! The stream a Python handle works on and the event that orders consumers of its views after its work. For None the
//! stream is created here (non-blocking) and destroyed with this object; otherwise it is the caller's, kept referenced.
//! A handle declares it before what it owns on the stream, so that the stream outlives that (the event goes first,
//! then a stream created here).
class HandleStream
{
public:
    //! Takes the stream `stream` names (see streamArgument) or creates one for None; throws TypeError or CudaError.
    explicit HandleStream(nb::handle stream);
    ~HandleStream() noexcept;
    HandleStream(HandleStream const&) = delete;
    HandleStream& operator=(HandleStream const&) = delete;

    //! Creates the ordering event on `device` (made current for the call) with the constructor's stream as producer;
    //! throws CudaError.
    void createEvent(int32_t device);

    //! Returns the stream given to or created by the constructor.
    cudaStream_t stream() const noexcept
    {
        return mStream;
    }
    //! Returns the order views of the handle wait on; the producer may be rewritten (a page-table build).
    StreamOrder& order() noexcept
    {
        return mOrder;
    }
    //! Returns the order views of the handle wait on.
    StreamOrder const& order() const noexcept
    {
        return mOrder;
    }

private:
    cudaStream_t mOwnedStream{nullptr};
    cudaStream_t mStream{nullptr};
    nb::object mStreamObject;
    StreamOrder mOrder;
};

} // namespace kvcache::python
