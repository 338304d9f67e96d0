# Writes the distinct GoogleTest executables among the tests of a `ctest --show-only=json-v1` listing, one a line
# (a test counts when gtest_discover_tests made it: its command passes --gtest_filter or names TEST_EXECUTABLE).
#   cmake -DLISTING=<json file> -DOUTPUT=<text file> -P list_test_executables.cmake
cmake_minimum_required(VERSION 3.25...4.1)

file(READ ${LISTING} listing)
string(JSON count LENGTH "${listing}" tests)
set(executables)
if(count GREATER 0)
  math(EXPR last "${count} - 1")
  foreach(index RANGE ${last})
    string(JSON command ERROR_VARIABLE error GET "${listing}" tests ${index} command)
    if(error)
      continue()
    endif()
    # Older CMake runs the executable with --gtest_filter; CMake 4.3+ runs a launcher script given
    # -D TEST_EXECUTABLE=<executable>.
    if(command MATCHES "\"TEST_EXECUTABLE=([^\"]+)\"")
      list(APPEND executables ${CMAKE_MATCH_1})
    elseif(command MATCHES "\"--gtest_filter=")
      string(JSON executable GET "${command}" 0)
      list(APPEND executables ${executable})
    endif()
  endforeach()
endif()
list(REMOVE_DUPLICATES executables)
file(WRITE ${OUTPUT} "")
foreach(executable IN LISTS executables)
  file(APPEND ${OUTPUT} "${executable}\n")
endforeach()
