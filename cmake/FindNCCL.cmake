# Finds NCCL: nccl.h and libnccl, from a system install, a CUDA toolkit, or the nvidia-nccl-cu13 wheel (whose files
# sit under nvidia/nccl/{include,lib}, the library only as libnccl.so.2).
#
# Hints: NCCL_ROOT (CMake or environment variable): a prefix holding include/nccl.h and lib/libnccl.so*, or a wheel's
# unpacked root (the folder holding nvidia/). Result: NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the
# imported target NCCL::NCCL.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
set(_nccl_prefixes)
foreach(_nccl_hint IN LISTS _nccl_hints)
  list(APPEND _nccl_prefixes ${_nccl_hint} ${_nccl_hint}/nvidia/nccl)
endforeach()

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_prefixes} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY
  NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${_nccl_prefixes} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_nccl_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_nccl_part} +([0-9]+).*" "\\1" _nccl_${_nccl_part} "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
