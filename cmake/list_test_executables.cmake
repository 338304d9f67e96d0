# Writes the distinct GoogleTest executables among the tests of a `ctest --show-only=json-v1` listing, one a line
# (a test counts when its command passes --gtest_filter, as gtest_discover_tests' tests do).
#   cmake -DLISTING=<json file> -DOUTPUT=<text file> -P list_test_executables.cmake
cmake_minimum_required(VERSION 3.25...4.1)

file(READ ${LISTING} listing)
string(JSON count LENGTH "${listing}" tests)
set(executables)
if(count GREATER 0)
  math(EXPR last "${count} - 1")
  foreach(index RANGE ${last})
    string(JSON command ERROR_VARIABLE error GET "${listing}" tests ${index} command)
    if(error OR NOT command MATCHES "\"--gtest_filter=")
      continue()
    endif()
    string(JSON executable GET "${command}" 0)
    list(APPEND executables ${executable})
  endforeach()
endif()
list(REMOVE_DUPLICATES executables)
file(WRITE ${OUTPUT} "")
foreach(executable IN LISTS executables)
  file(APPEND ${OUTPUT} "${executable}\n")
endforeach()
