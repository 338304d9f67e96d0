#include "bindings.h"

#include <kvcache/errors.h>

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

    // Most derived first: InvalidConfigError is an InvalidArgumentError.
    nb::register_exception_translator(
        [](std::exception_ptr const& error, void*)
        {
            try
            {
                std::rethrow_exception(error);
            }
            catch (rt::InvalidConfigError const& e)
            {
                PyErr_SetString(gInvalidConfigError, e.what());
            }
            catch (rt::InvalidArgumentError const& e)
            {
                PyErr_SetString(gInvalidArgumentError, e.what());
            }
            catch (rt::OutOfRangeError const& e)
            {
                PyErr_SetString(gOutOfRangeError, e.what());
            }
            catch (rt::OutOfMemoryError const& e)
            {
                PyErr_SetString(gOutOfMemoryError, e.what());
            }
            catch (rt::CudaError const& e)
            {
                PyErr_SetString(gCudaError, e.what());
            }
            catch (rt::Error const& e)
            {
                PyErr_SetString(PyExc_RuntimeError, e.what());
            }
        });
}

} // namespace kvcache::python
