#pragma once

#include <cstdint>

namespace kvcache::rt::detail
{

//! One layer as the page kernels see it: pages are bytes, so dtype and head shape reduce to pageBytes.
struct LayerTableEntry
{
    char* kBase;        //!< start of the K pool
    int64_t halfBytes;  //!< V pool starts at kBase + halfBytes
    int64_t pageBytes;  //!< bytes of one page of one half
    int64_t firstChunk; //!< the page kernels' 32 KiB chunks of one page in all earlier layers (filled on upload)
};

} // namespace kvcache::rt::detail
