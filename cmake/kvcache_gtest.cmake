# kvcache_discover_tests(<target> [PREFIX <prefix>] [LABELS <labels...>])
# Registers each GoogleTest test of <target> as a CTest named <prefix><Suite>.<Test>, GoogleTest's own full name
# (for a parameterised or typed test, the index or the name generator's name: "Runs/PageManagerRandom.Run/xxh3",
# "HybridViewsTest/float16.Rings"). CMake 3.25's gtest_discover_tests instead appends the printed type or value, which
# for a typed suite with named types comes out as the whole listing line, hundreds of characters long. The tests are
# listed when ctest runs (the program's --gtest_list_tests), so they follow the program as built; a program that was
# not built gives one failing test, <target>_NOT_BUILT, with no label.
set(KVCACHE_GTEST_ADD_TESTS_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/kvcache_gtest_add_tests.cmake)

function(kvcache_discover_tests target)
  cmake_parse_arguments(ARG "" "PREFIX" "LABELS" ${ARGN})
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_tests.cmake)
  file(GENERATE OUTPUT ${include_file} CONTENT "set(KVCACHE_GTEST_TARGET [==[${target}]==])
set(KVCACHE_GTEST_EXECUTABLE [==[$<TARGET_FILE:${target}>]==])
set(KVCACHE_GTEST_WORKING_DIRECTORY [==[${CMAKE_CURRENT_BINARY_DIR}]==])
set(KVCACHE_GTEST_PREFIX [==[${ARG_PREFIX}]==])
set(KVCACHE_GTEST_LABELS [==[${ARG_LABELS}]==])
include([==[${KVCACHE_GTEST_ADD_TESTS_SCRIPT}]==])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
