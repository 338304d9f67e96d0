#pragma once

#include <cstdint>

namespace kvcache::rt::detail
{

//! One layer as the page kernels see it: pages are bytes, so dtype and head shape reduce to pageBytes, and the V pool
//! starts numPages * pageBytes after kBase. 16 bytes, 16-aligned: a kernel fetches an entry with one load.
struct alignas(16) LayerTableEntry
{
    char* kBase;       //!< start of the K pool
    int64_t pageBytes; //!< bytes of one page of one half
};

} // namespace kvcache::rt::detail
