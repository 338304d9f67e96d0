#pragma once

// What the host benchmark programs share: a check that stops a case, a guard that turns its exception into a failed
// case, and a main() that makes the process exit 1 when any case failed.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

namespace kvcache::bench
{

//! Cases that stopped with an error (a failed check or an exception); any makes the process exit 1.
inline int32_t gFailedCases = 0;

//! Throws std::runtime_error with `message` when `condition` is false: a benchmark whose work went wrong must not
//! report a time.
inline void check(bool condition, std::string const& message)
{
    if (!condition)
    {
        throw std::runtime_error("check failed: " + message);
    }
}

//! Runs `body` and turns an exception into a stopped case that makes the process fail.
template <typename Body>
void guarded(benchmark::State& state, Body&& body)
{
    try
    {
        body();
    }
    catch (std::exception const& error)
    {
        ++gFailedCases;
        state.SkipWithError(error.what());
    }
}

//! The body of a benchmark program's main(): parses the arguments, registers the cases, runs them; returns 1 when an
//! argument is unknown or a case failed (naming `program`), else 0.
template <typename Register>
int runBenchmarks(int argc, char** argv, char const* program, Register&& registerAll)
{
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv))
    {
        return 1;
    }
    registerAll();
    size_t const cases = benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    if (gFailedCases > 0)
    {
        std::fprintf(stderr, "%s: %d of %zu case(s) failed\n", program, gFailedCases, cases);
        return 1;
    }
    return 0;
}

} // namespace kvcache::bench
