#include "bindings.h"
#include "dlpack_view.h"
#include "write_binding.h"

#include <kvcache/version.h>

#include <cuda_runtime_api.h>
#include <nanobind/stl/string.h>

#include <string>

namespace nb = nanobind;

NB_MODULE(_kvcache, m)
{
    m.doc() = "kvcache: per-layer KV cache memory, zero-copy DLPack views and page operations (C++ core).";
    kvcache::python::bindErrors(m);
    kvcache::python::bindConfig(m);
    kvcache::python::bindViews(m);
    kvcache::python::bindManager(m);
    kvcache::python::bindAllocator(m);
    kvcache::python::bindPageTable(m);
    kvcache::python::bindPageManager(m);
    kvcache::python::bindStepArguments(m);
    kvcache::python::bindWrite(m);
    kvcache::python::bindPageTableTokenArrays(m);
    kvcache::python::bindHostTier(m);
    kvcache::python::bindSequenceFiles(m);
    kvcache::python::bindTieredPrefixCache(m);
    kvcache::python::bindTransfer(m);
    kvcache::python::bindEvents(m);

    m.attr("__version__") = KVCACHE_VERSION_STRING;
    m.def(
        "gpu_unavailable_reason",
        []() -> std::string
        {
            int count = 0;
            cudaError_t const status = cudaGetDeviceCount(&count);
            if (status != cudaSuccess)
            {
                cudaGetLastError();
                return std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(status) + " ("
                    + cudaGetErrorString(status) + ")";
            }
            return count == 0 ? "no CUDA device is visible" : "";
        },
        "Returns why no GPU can be used here, or an empty string when one can.");

    // What `from kvcache._kvcache import *` takes, and so what the kvcache package exports: every public name defined
    // above, and the version. Taken from the module itself, so that each name is written once, where it is bound.
    nb::list exported;
    for (nb::handle name : nb::borrow<nb::dict>(m.attr("__dict__")).keys())
    {
        std::string const key = nb::cast<std::string>(name);
        if (key.front() != '_' || key == "__version__")
        {
            exported.append(name);
        }
    }
    m.attr("__all__") = exported;
}
