#pragma once

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt
{

//! One layer of a page group as its pages hold it.
struct PageLayerGeometry
{
    KVLayerKind kind = KVLayerKind::kKV;
    int32_t numKVHeads = 0;
    int32_t headDim = 0;
};

//! What a page of one page group is: one page id's bytes of every layer of the group in layer order, each layer's K
//! half then its V half (a latent layer: its one half); then, for a quantization with page scales
//! (kFP8_PER_TOKEN_HEAD, kNVFP4), every layer's scale page in the same order, K scales then V scales (none for a
//! latent layer's V). Pages of equal geometries hold the same bytes in the same places, so a page moves (host tier,
//! sequence file) only between equal geometries.
struct PageGeometry
{
    DataType dataType = DataType::kHALF;
    //! How the values are stored and scaled (docs/layout.md, "Quantized pages"): which scale bytes a page holds.
    KVQuantization quantization = KVQuantization::kNONE;
    int32_t tokensPerPage = 0;
    //! The group's sliding window, 0 for full attention.
    int32_t slidingWindow = 0;
    std::vector<PageLayerGeometry> layers = {};
    //! Bytes of one page: the group's bytesPerPage, data and scales.
    int64_t bytesPerPage = 0;
};

//! Returns true when the two layers have the same kind, head count and head size.
bool operator==(PageLayerGeometry const& a, PageLayerGeometry const& b) noexcept;
//! Returns true when any field differs.
bool operator!=(PageLayerGeometry const& a, PageLayerGeometry const& b) noexcept;
//! Returns true when every field (the layers in order) is equal.
bool operator==(PageGeometry const& a, PageGeometry const& b) noexcept;
//! Returns true when any field differs.
bool operator!=(PageGeometry const& a, PageGeometry const& b) noexcept;

//! Returns "" when `a` and `b` are equal, else their first field that differs (in the order quantization, dataType,
//! tokensPerPage, slidingWindow, the number of layers, each layer's kind, numKVHeads and headDim, bytesPerPage) with
//! both values, naming the two sides `aName` and `bName`: "quantization is none in the cache and fp8_per_tensor in the
//! tier". Every check that two pages are interchangeable uses this, so each refusal names what differs.
std::string pageGeometryDifference(
    PageGeometry const& a, PageGeometry const& b, char const* aName = "the first", char const* bName = "the second");

//! Returns the 64-bit FNV-1a hash (offset basis 14695981039346656037, prime 1099511628211) of this byte encoding of
//! `geometry`: little-endian int32 values of the data type's and the quantization's enumerators, tokensPerPage,
//! slidingWindow and the number of layers, then per layer its kind's enumerator, numKVHeads and headDim, then
//! bytesPerPage as an int64. Equal geometries have equal fingerprints.
uint64_t pageGeometryFingerprint(PageGeometry const& geometry) noexcept;

//! Returns what a page holds of layer `layer`: its kind, head count and head size.
PageLayerGeometry pageLayerGeometry(KVLayerLayout const& layer) noexcept;

//! Returns the page geometry of page group `group` of `layout`; throws OutOfRangeError for a group outside
//! [0, layout.groups.size()).
PageGeometry pageGeometry(KVCacheLayout const& layout, int32_t group);

} // namespace kvcache::rt
