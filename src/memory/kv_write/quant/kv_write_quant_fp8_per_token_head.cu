// The quantizing kernel's launches for fp8_per_token_head caches.

#include "memory/kv_write/quant/kv_write_quant_launch.cuh"

namespace kvcache::rt::detail
{

KVCACHE_INSTANTIATE_QUANT_FORMAT(KVQuantization::kFP8_PER_TOKEN_HEAD)

} // namespace kvcache::rt::detail
