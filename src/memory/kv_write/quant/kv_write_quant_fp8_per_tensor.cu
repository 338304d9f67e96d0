// The quantizing kernel's launches for fp8_per_tensor caches.

#include "memory/kv_write/quant/kv_write_quant_launch.cuh"

namespace kvcache::rt::detail
{

KVCACHE_INSTANTIATE_QUANT_FORMAT(KVQuantization::kFP8_PER_TENSOR)

} // namespace kvcache::rt::detail
