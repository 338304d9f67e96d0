#pragma once

#include <nanobind/nanobind.h>

namespace kvcache::python
{

namespace nb = nanobind;

//! Registers the exception types and the translation of kvcache's C++ errors to them.
void bindErrors(nb::module_& m);
//! Registers the enums, KVLayerConfig, Config, the layout types and the budget functions.
void bindConfig(nb::module_& m);
//! Registers KVCacheManager, PageOpTarget, LayerRef and the page operations.
void bindManager(nb::module_& m);
//! Registers PageAllocator.
void bindAllocator(nb::module_& m);
//! Registers PageTableBuffers.
void bindPageTable(nb::module_& m);
//! Registers PageManager and its option, count and statistics types.
void bindPageManager(nb::module_& m);

} // namespace kvcache::python
