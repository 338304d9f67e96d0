#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace kvcache::rt
{

//! Base of every runtime error kvcache throws (all but index errors, which are std::out_of_range).
class Error : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! Thrown for an argument that breaks a documented rule (e.g. a page that is both source and destination).
class InvalidArgumentError : public Error
{
public:
    using Error::Error;
};

//! Thrown when a KVCacheManager::Config breaks a rule; the message names the field, the value and the limit.
class InvalidConfigError : public InvalidArgumentError
{
public:
    using InvalidArgumentError::InvalidArgumentError;
};

//! Thrown for a layer index or page id outside its range; the message names the index and the limit.
class OutOfRangeError : public std::out_of_range
{
public:
    using std::out_of_range::out_of_range;
};

//! Thrown when a CUDA runtime call fails; the message names the call, file, line and CUDA's error.
class CudaError : public Error
{
public:
    CudaError(cudaError_t status, std::string const& message)
        : Error(message)
        , mStatus(status)
    {
    }
    //! Returns the CUDA status that caused the error.
    cudaError_t status() const noexcept
    {
        return mStatus;
    }

private:
    cudaError_t mStatus;
};

//! Thrown when device memory for the cache cannot be had; the message says how much was asked and how much is free.
class OutOfMemoryError : public Error
{
public:
    using Error::Error;
};

namespace detail
{
//! Throws CudaError for `status` (clearing CUDA's last error first); `call`, `file` and `line` locate the call.
[[noreturn]] void throwCudaError(cudaError_t status, char const* call, char const* file, int line);
//! Prints a failed call to stderr without throwing, for destructors; returns `status`.
cudaError_t logCudaError(cudaError_t status, char const* call, char const* file, int line) noexcept;
//! Prints that `noun` index `index` is outside [0, count) for `what` and aborts; for noexcept accessors.
[[noreturn]] void failIndex(char const* what, char const* noun, long long index, long long count) noexcept;
} // namespace detail

} // namespace kvcache::rt

//! Evaluates a CUDA runtime call and throws kvcache::rt::CudaError if it does not return cudaSuccess.
#define KVCACHE_CUDA_TRY(call)                                                                                         \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const kvcacheStatus_ = (call);                                                                     \
        if (kvcacheStatus_ != cudaSuccess)                                                                             \
        {                                                                                                              \
            ::kvcache::rt::detail::throwCudaError(kvcacheStatus_, #call, __FILE__, __LINE__);                          \
        }                                                                                                              \
    } while (0)

//! Evaluates a CUDA runtime call and prints (never throws) if it fails; for destructors and cleanup paths.
#define KVCACHE_CUDA_LOG(call) ::kvcache::rt::detail::logCudaError((call), #call, __FILE__, __LINE__)
