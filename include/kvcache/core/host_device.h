#pragma once

//! Marks functions callable from host and device code when compiled by nvcc; plain functions elsewhere, so a header
//! that uses it needs no CUDA header and works from .cpp files.
#if defined(__CUDACC__)
#define KVCACHE_HOST_DEVICE __host__ __device__
#else
#define KVCACHE_HOST_DEVICE
#endif
