#include "handle_stream.h"

#include "core/scoped_device.h"
#include "cuda_arguments.h"

#include <kvcache/core/errors.h>

namespace kvcache::python
{

HandleStream::HandleStream(nb::handle stream)
{
    if (stream.is_none())
    {
        KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&mOwnedStream, cudaStreamNonBlocking));
        mStream = mOwnedStream;
    }
    else
    {
        mStream = streamArgument(stream, nullptr);
        mStreamObject = nb::borrow(stream);
    }
}

HandleStream::~HandleStream() noexcept
{
    if (mOrder.event != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaEventDestroy(mOrder.event));
    }
    if (mOwnedStream != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaStreamDestroy(mOwnedStream));
    }
}

void HandleStream::createEvent(int32_t device)
{
    rt::detail::ScopedDevice const scoped(device);
    KVCACHE_CUDA_TRY(cudaEventCreateWithFlags(&mOrder.event, cudaEventDisableTiming));
    mOrder.producer = mStream;
    mOrder.device = device;
}

} // namespace kvcache::python
