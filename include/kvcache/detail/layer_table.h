#pragma once

#include <cstdint>

namespace kvcache::rt::detail
{

//! One layer as the page kernels see it: pages are bytes, so dtype and head shape reduce to pageBytes.
struct LayerTableEntry
{
    char* kBase;       //!< start of the K pool
    int64_t halfBytes; //!< V pool starts at kBase + halfBytes
    int64_t pageBytes; //!< bytes of one page of one half
};

} // namespace kvcache::rt::detail
