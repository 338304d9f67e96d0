#pragma once

// Arguments a function takes as any object and checks itself (so that its messages name the argument), declared by
// the type they stand for: nanobind renders that name in the function's signature, and stubgen copies it into
// _kvcache.pyi. Names without a module (StreamLike, PageIds, ...) are the stub's type aliases, which
// python/stub_patterns.txt declares.

#include <nanobind/nanobind.h>

namespace kvcache::python
{

namespace nb = nanobind;

//! Accepts every object: the function that takes it checks it.
inline bool anyObject(PyObject*) noexcept
{
    return true;
}

// NOLINTNEXTLINE(cppcoreguidelines-macro-usage): NB_OBJECT_DEFAULT, which it wraps, is a macro too.
#define KVCACHE_TYPED_ARGUMENT(Type, Hint)                                                                             \
    class Type : public nb::object                                                                                     \
    {                                                                                                                  \
        NB_OBJECT_DEFAULT(Type, object, Hint, anyObject)                                                               \
    }

KVCACHE_TYPED_ARGUMENT(IntArgument, "int");
KVCACHE_TYPED_ARGUMENT(BytesArgument, "bytes");
KVCACHE_TYPED_ARGUMENT(StreamArgument, "StreamLike");
KVCACHE_TYPED_ARGUMENT(DeviceArrayArgument, "DeviceArray");
KVCACHE_TYPED_ARGUMENT(PagePairsArgument, "PagePairs");
KVCACHE_TYPED_ARGUMENT(PageIdsArgument, "PageIds");
KVCACHE_TYPED_ARGUMENT(StatePairsArgument, "StatePairs");
//! A state tensor of a state layer: its index or its name.
KVCACHE_TYPED_ARGUMENT(StateTensorArgument, "int | str");
KVCACHE_TYPED_ARGUMENT(CacheArgument, "KVCacheManager");
KVCACHE_TYPED_ARGUMENT(WriteCountersArgument, "WriteCounters");
KVCACHE_TYPED_ARGUMENT(PageOpTargetArgument, "PageOpTarget");
KVCACHE_TYPED_ARGUMENT(LayoutSourceArgument, "KVCacheManager | KVCacheLayout | Config");
KVCACHE_TYPED_ARGUMENT(LayerConfigsArgument, "collections.abc.Sequence[KVLayerConfig | tuple[typing.Any, ...]]");
KVCACHE_TYPED_ARGUMENT(TableSequencesArgument, "collections.abc.Sequence[tuple[PageIds, int]]");
KVCACHE_TYPED_ARGUMENT(ExtraKeysArgument, "collections.abc.Sequence[tuple[int, int, int]]");
KVCACHE_TYPED_ARGUMENT(PageHashArgument, "tuple[int, int]");
KVCACHE_TYPED_ARGUMENT(EvictionCallbackArgument, "collections.abc.Callable[[int, int, tuple[int, int]], None]");
//! PageManager's appends: (sequence, tokens[, extra_keys]).
KVCACHE_TYPED_ARGUMENT(AppendsArgument,
    "collections.abc.Sequence[tuple[int, PageIds] | tuple[int, PageIds, collections.abc.Sequence[tuple[int, int, "
    "int]]]]");
//! StepArguments' entries: a step's appends, or (sequence, token count) pairs.
KVCACHE_TYPED_ARGUMENT(StepEntriesArgument,
    "collections.abc.Sequence[tuple[int, PageIds | int] | tuple[int, PageIds, collections.abc.Sequence[tuple[int, "
    "int, int]]]]");
//! TieredPrefixCache's appends: as PageManager's, with host token lists.
KVCACHE_TYPED_ARGUMENT(HostAppendsArgument,
    "collections.abc.Sequence[tuple[int, HostIds] | tuple[int, HostIds, collections.abc.Sequence[tuple[int, int, "
    "int]]]]");

#undef KVCACHE_TYPED_ARGUMENT

//! The signature of an __eq__ that compares two objects of its class, declared as object.__eq__'s, which it overrides.
inline char const* const kEQ_SIGNATURE = "def __eq__(self, arg: object, /) -> bool";

} // namespace kvcache::python
