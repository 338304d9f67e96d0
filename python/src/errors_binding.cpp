#include "bindings.h"

#include <kvcache/core/errors.h>

#include <exception>
#include <string>

namespace kvcache::python
{
namespace
{

// Created once at import; the module keeps a reference to each.
PyObject* gInvalidArgumentError = nullptr;
PyObject* gInvalidConfigError = nullptr;
PyObject* gOutOfRangeError = nullptr;
PyObject* gOutOfMemoryError = nullptr;
PyObject* gCudaError = nullptr;

PyObject* newException(nb::module_& m, char const* name, PyObject* base, char const* doc)
{
    std::string const qualified = std::string("kvcache._kvcache.") + name;
    PyObject* const type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
    if (type == nullptr)
    {
        throw nb::python_error();
    }
    m.attr(name) = nb::handle(type);
    return type;
}

//! Sets `type` with the message of `error` when `error` is an `Error`; returns whether it was.
template <typename Error>
bool translateAs(std::exception const& error, PyObject* type)
{
    if (dynamic_cast<Error const*>(&error) == nullptr)
    {
        return false;
    }
    PyErr_SetString(type, error.what());
    return true;
}

} // namespace

void bindErrors(nb::module_& m)
{
    gInvalidArgumentError = newException(m, "InvalidArgumentError", PyExc_ValueError,
        "An argument broke a documented rule; the message names the field, the value and the limit.");
    gInvalidConfigError = newException(m, "InvalidConfigError", gInvalidArgumentError,
        "A Config broke a rule; the message names the field, the value and the limit.");
    gOutOfRangeError =
        newException(m, "OutOfRangeError", PyExc_IndexError, "A layer index, group or page id outside its range.");
    gOutOfMemoryError =
        newException(m, "OutOfMemoryError", PyExc_MemoryError, "Device memory or free pages could not be had.");
    gCudaError = newException(m, "CudaError", PyExc_RuntimeError, "A CUDA runtime call failed.");

    nb::register_exception_translator(
        [](std::exception_ptr const& error, void*)
        {
            try
            {
                std::rethrow_exception(error);
            }
            catch (std::exception const& e)
            {
                // Most derived first: InvalidConfigError is an InvalidArgumentError. Other standard exceptions go on
                // to nanobind's own translation.
                bool const translated = translateAs<rt::InvalidConfigError>(e, gInvalidConfigError)
                    || translateAs<rt::InvalidArgumentError>(e, gInvalidArgumentError)
                    || translateAs<rt::OutOfRangeError>(e, gOutOfRangeError)
                    || translateAs<rt::OutOfMemoryError>(e, gOutOfMemoryError)
                    || translateAs<rt::CudaError>(e, gCudaError) || translateAs<rt::Error>(e, PyExc_RuntimeError);
                if (!translated)
                {
                    throw;
                }
            }
        });
}

} // namespace kvcache::python
