// The quantizing kernel's launches for nvfp4 caches.

#include "memory/kv_write/quant/kv_write_quant_launch.cuh"

namespace kvcache::rt::detail
{

KVCACHE_INSTANTIATE_QUANT_FORMAT(KVQuantization::kNVFP4)

} // namespace kvcache::rt::detail
