#include "bindings.h"
#include "cuda_arguments.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/paging/page_allocator.h>

#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <iterator>
#include <string>
#include <vector>

namespace kvcache::python
{
namespace
{

//! A PageAllocator and the scratch list that host page lists are read into (reused: no allocation in steady state).
struct AllocatorHandle
{
    rt::PageAllocator allocator;
    std::vector<int32_t> pages;
};

using Int32Out = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

//! allocate_into's `out`, taken as any object so that what is not an Int32Out is refused with a message (outArray)
//! rather than converted; named in signatures as the Int32Out it must be.
class Int32OutArgument : public nb::object
{
public:
    static constexpr auto Name = nb::detail::make_caster<Int32Out>::Name;
    Int32OutArgument(nb::handle h, nb::detail::borrow_t)
        : nb::object(h, nb::detail::borrow_t{})
    {
    }
    Int32OutArgument(nb::handle h, nb::detail::steal_t)
        : nb::object(h, nb::detail::steal_t{})
    {
    }
    Int32OutArgument() = default;
    static bool check_(nb::handle) noexcept
    {
        return true;
    }
};

//! Returns the name of a DLPack element type, e.g. "int64".
std::string dtypeName(nb::dlpack::dtype type)
{
    // DLPack's type codes 0 to 6; the newer float8/6/4 codes print as code<N>.
    constexpr char const* kKINDS[] = {"int", "uint", "float", "code3", "bfloat", "complex", "bool"};
    std::string const kind = type.code < std::size(kKINDS) ? kKINDS[type.code] : fmt::format("code{}", type.code);
    std::string name = fmt::format("{}{}", kind, type.bits);
    return type.lanes == 1 ? name : fmt::format("{}x{}", name, type.lanes);
}

//! Returns `out` as the array allocate_into fills in place. Anything else is refused before a page is taken: a
//! converted copy (another dtype, a strided view) would be filled instead of `out` and its pages lost.
Int32Out outArray(nb::handle out)
{
    Int32Out array;
    if (nb::try_cast(out, array, false))
    {
        return array;
    }
    char const* const needed = "a writable one-dimensional C-contiguous int32 host array";
    nb::ndarray<nb::ro> any;
    if (!nb::try_cast(out, any, false))
    {
        throwTypeError(out, "out", needed);
    }
    std::string shape;
    std::string strides;
    for (size_t i = 0; i < any.ndim(); ++i)
    {
        shape += fmt::format("{}{}", i == 0 ? "" : ", ", any.shape(i));
        strides += fmt::format("{}{}", i == 0 ? "" : ", ", any.stride(i));
    }
    nb::ndarray<int32_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu> readOnly;
    if (nb::try_cast(out, readOnly, false))
    {
        throw rt::InvalidArgumentError(fmt::format("out is a read-only array; it must be {}", needed));
    }
    throw rt::InvalidArgumentError(
        fmt::format("out has dtype {}, shape ({}), strides ({}) in elements and DLPack device type {}; it must be {}",
            dtypeName(any.dtype()), shape, strides, any.device_type(), needed));
}

} // namespace

void bindAllocator(nb::module_& m)
{
    nb::class_<AllocatorHandle>(m, "PageAllocator",
        "Page ids of one page group on the host: an O(1) LIFO free list and a reference count per page. Every "
        "rejected call raises before it changes anything.")
        .def(
            "__init__",
            [](AllocatorHandle* self, int64_t numPages)
            {
                if (numPages < 0 || numPages > rt::kMAX_NUM_PAGES)
                {
                    throw rt::InvalidArgumentError(
                        fmt::format("PageAllocator num_pages is {}; it must be in [0, {}] (MAX_NUM_PAGES)", numPages,
                            rt::kMAX_NUM_PAGES));
                }
                new (self) AllocatorHandle{rt::PageAllocator(static_cast<int32_t>(numPages)), {}};
            },
            nb::arg("num_pages"))
        .def("num_pages", [](AllocatorHandle const& a) { return a.allocator.numPages(); })
        .def("num_free", [](AllocatorHandle const& a) { return a.allocator.numFree(); })
        .def("num_used", [](AllocatorHandle const& a) { return a.allocator.numUsed(); })
        .def(
            "allocate", [](AllocatorHandle& a) { return a.allocator.allocate(); },
            "Returns a free page (the most recently freed), now with reference count 1; raises OutOfMemoryError when "
            "none is free.")
        .def(
            "allocate",
            [](AllocatorHandle& a, int64_t count)
            {
                int32_t const pages = toInt32(count, "count");
                std::vector<int32_t> result(static_cast<size_t>(pages < 0 ? 0 : pages));
                a.allocator.allocate(pages, result.data());
                return result;
            },
            nb::arg("count"),
            "Returns `count` free pages, all or nothing (OutOfMemoryError naming the pages needed and free).")
        .def(
            "allocate_into",
            [](AllocatorHandle& a, Int32OutArgument const& out)
            {
                Int32Out const array = outArray(out);
                a.allocator.allocate(toInt32(static_cast<int64_t>(array.shape(0)), "len(out)"), array.data());
            },
            nb::arg("out"),
            "Fills `out`, a writable one-dimensional C-contiguous int32 host array, with free pages, all or nothing; "
            "allocates nothing. Raises InvalidArgumentError (a ValueError) for another dtype, layout or device, "
            "TypeError for what is no array, before taking a page.")
        .def(
            "retain", [](AllocatorHandle& a, int64_t page) { a.allocator.retain(toInt32(page, "page")); },
            nb::arg("page"), "Adds a holder to a used page.")
        .def(
            "release",
            [](AllocatorHandle& a, PageIdsArgument const& pages)
            {
                if (PyLong_Check(pages.ptr()))
                {
                    a.allocator.release(toInt32(intArgument(pages, "page"), "page"));
                    return;
                }
                hostPageIds(pages, a.pages);
                a.allocator.release(a.pages.data(), static_cast<int32_t>(a.pages.size()));
            },
            nb::arg("pages"),
            "Releases one page (an int) or each page of a list once, all or nothing; a page at count 0 is free.")
        .def(
            "ref_count",
            [](AllocatorHandle const& a, int64_t page) { return a.allocator.refCount(toInt32(page, "page")); },
            nb::arg("page"), "Reference count of a page, 0 when free.")
        .def(
            "check_invariants", [](AllocatorHandle const& a) { a.allocator.checkInvariants(); },
            "Raises RuntimeError describing the first broken invariant.");
}

} // namespace kvcache::python
