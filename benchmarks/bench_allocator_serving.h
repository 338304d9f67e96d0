#pragma once

// The serving workload cases of kvcache-bench-allocator (f and j), registered by its main
// (bench_allocator_serving.cpp).

namespace kvcache::bench
{

//! Registers cases f (hybrid_prefix, hot_prefix) and j (state_prefix).
void registerServingCases();

} // namespace kvcache::bench
