#pragma once

// The header two sides of a page transfer exchange before any page moves, and what makes two headers agree: the same
// geometry and quantization, group, count and path, and the same host-held layer scales. Host only, no NCCL, no CUDA
// calls, so that the checks are testable without GPUs.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt::detail
{

//! "KVTP": the first word of every header, so that bytes from anything else are told apart.
inline constexpr uint32_t kTRANSFER_HEADER_MAGIC = 0x4B565450;

//! What the two sides exchange first; equal fields (the magic aside, which must be kTRANSFER_HEADER_MAGIC) let the
//! pages move. No padding: every byte sent is a field's.
struct TransferHeader
{
    uint32_t magic;
    int32_t group;
    uint64_t fingerprint; //!< pageGeometryFingerprint of the group's page geometry
    int32_t count;
    int32_t path;         //!< TransferPath's enumerator
    uint64_t scalesHash;  //!< hostScalesHash of the group
    int32_t quantization; //!< KVQuantization's enumerator (also in the fingerprint; here to name it in a refusal)
    int32_t reserved;     //!< 0
};
static_assert(sizeof(TransferHeader) == 40, "TransferHeader has no padding: the bytes sent are its fields");

//! Returns the 64-bit FNV-1a hash (detail::Fnv1a) of the host-held scales (KVCacheManager::layerScales) of
//! page group `group`'s layers of `layout`, in the group's order: per layer the bits of k as a little-endian uint32,
//! then the bits of v, except for a latent layer, whose v scales nothing and is left out (as sequence files compare
//! them). Bits, not values: -0 and 0, or two NaNs, differ as the pages they would decode differ. `scales` holds one
//! entry a layer of `layout` (indexed by layer); for a quantization that keeps no host-held scales it is not read
//! and the result is the hash of nothing, the offset basis. `group` must be in [0, layout.groups.size()).
uint64_t hostScalesHash(KVCacheLayout const& layout, int32_t group, std::vector<LayerScales> const& scales) noexcept;

//! Returns "" when `theirs` (from peer `peer`) agrees with `mine`, else why not, naming the field and both values:
//! the magic, the quantization, the group and count, the group's page geometry fingerprint, the path, the host-held
//! scales, the first that differs. The quantization comes before the fingerprint, which includes it, so that a
//! refusal names it.
std::string headerMismatch(TransferHeader const& mine, TransferHeader const& theirs, int32_t peer);

} // namespace kvcache::rt::detail
