#pragma once

#include <nanobind/nanobind.h>

namespace kvcache::python
{

namespace nb = nanobind;

//! Adds nothing: ends the list of readOnlyFields.
template <typename Class>
void readOnlyFields(Class&)
{
}

//! Adds a read-only attribute to `cls` for each (Python name, member pointer) pair, in order.
template <typename Class, typename Member, typename... Rest>
void readOnlyFields(Class& cls, char const* name, Member member, Rest... rest)
{
    cls.def_ro(name, member);
    readOnlyFields(cls, rest...);
}

//! Registers the exception types and the translation of kvcache's C++ errors to them.
void bindErrors(nb::module_& m);
//! Registers the enums, KVLayerConfig, LayerScales, Config, the layout types and the budget functions.
void bindConfig(nb::module_& m);
//! Registers KVCacheManager, PageOpTarget, LayerRef and the page operations.
void bindManager(nb::module_& m);
//! Registers PageAllocator.
void bindAllocator(nb::module_& m);
//! Registers PageTableBuffers.
void bindPageTable(nb::module_& m);
//! Registers PageManager and its option, count and statistics types.
void bindPageManager(nb::module_& m);
//! Registers StepArguments (after bindPageManager: it takes a PageManager).
void bindStepArguments(nb::module_& m);
//! Registers HostTier, HostTierMethod and the page geometry types.
void bindHostTier(nb::module_& m);
//! Registers SequenceFileInfo and the sequence-file functions (after bindHostTier: they take its types).
void bindSequenceFiles(nb::module_& m);
//! Registers TieredPrefixCache, TieredAdmission and TieredPrefixCacheStats (after bindHostTier and bindPageManager).
void bindTieredPrefixCache(nb::module_& m);
//! Registers the transfer descriptor functions (transfer_registration, transfer_mismatch, transfer_descriptors).
void bindTransfer(nb::module_& m);

//! Registers KVEventPublisher (which only a build with kvcache::events can make: KVCACHE_PYTHON_EVENTS).
void bindEvents(nb::module_& m);

} // namespace kvcache::python
