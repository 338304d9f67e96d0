# Run by ctest (through a TEST_INCLUDE_FILES entry that kvcache_discover_tests writes): lists the GoogleTest tests of
# one program and adds a CTest for each. Inputs: KVCACHE_GTEST_TARGET, KVCACHE_GTEST_EXECUTABLE,
# KVCACHE_GTEST_WORKING_DIRECTORY, KVCACHE_GTEST_PREFIX, KVCACHE_GTEST_LABELS.
if(NOT EXISTS "${KVCACHE_GTEST_EXECUTABLE}")
  add_test("${KVCACHE_GTEST_TARGET}_NOT_BUILT" "${KVCACHE_GTEST_EXECUTABLE}")
  return()
endif()

execute_process(COMMAND "${KVCACHE_GTEST_EXECUTABLE}" --gtest_list_tests
  WORKING_DIRECTORY "${KVCACHE_GTEST_WORKING_DIRECTORY}"
  OUTPUT_VARIABLE listing RESULT_VARIABLE status TIMEOUT 60)
if(NOT status EQUAL 0)
  # Runs the listing again as a test, so that its failure and output show in ctest's report.
  add_test("${KVCACHE_GTEST_TARGET}_LISTING_FAILED" "${KVCACHE_GTEST_EXECUTABLE}" --gtest_list_tests)
  return()
endif()

string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suite "")
foreach(line IN LISTS lines)
  # "Suite." or "Prefix/Suite/Name.  # TypeParam = ...": a suite; "  Test" or "  Test/Name  # GetParam() = ...": a
  # test of it. gtest_main's "Running main() from ..." has spaces, so it matches neither.
  if(line MATCHES "^([^ ]+)\\.( +#.*)?$")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([^ ]+)( +#.*)?$" AND suite)
    set(test "${CMAKE_MATCH_1}")
    if(suite MATCHES "(^|/)DISABLED_" OR test MATCHES "^DISABLED_")
      continue()
    endif()
    set(name "${KVCACHE_GTEST_PREFIX}${suite}.${test}")
    add_test("${name}" "${KVCACHE_GTEST_EXECUTABLE}" "--gtest_filter=${suite}.${test}")
    set_tests_properties("${name}" PROPERTIES
      WORKING_DIRECTORY "${KVCACHE_GTEST_WORKING_DIRECTORY}"
      SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
      LABELS "${KVCACHE_GTEST_LABELS}")
  endif()
endforeach()
