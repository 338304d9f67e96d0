# One step of the consumer-project tests, run as
#   cmake -DSTEP=<install|build_tree|install_tree> -DCONFIG=<build config> -DSETTINGS=<settings file> -P <this>
#   install:      installs the kvcache build into a fresh prefix and checks the package is relocatable;
#   build_tree:   configures, builds and runs the consumer with kvcache_DIR set to the build tree;
#   install_tree: the same with CMAKE_PREFIX_PATH set to the installed prefix.
cmake_minimum_required(VERSION 3.25...4.1)
include(${SETTINGS})

set(config_args)
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()

set(transfer_files)
set(transfer_args)
if(KVCACHE_WITH_TRANSFER)
  set(transfer_files ${KVCACHE_INSTALL_CMAKE_DIR}/kvcacheTransferTargets.cmake ${KVCACHE_INSTALL_CMAKE_DIR}/FindNCCL.cmake)
  set(transfer_args -DKVCACHE_CONSUMER_TRANSFER=ON -DNCCL_INCLUDE_DIR=${KVCACHE_NCCL_INCLUDE_DIR}
    -DNCCL_LIBRARY=${KVCACHE_NCCL_LIBRARY})
endif()

if(KVCACHE_WITH_EVENTS)
  list(APPEND transfer_files ${KVCACHE_INSTALL_CMAKE_DIR}/kvcacheEventsTargets.cmake)
  list(APPEND transfer_args -DKVCACHE_CONSUMER_EVENTS=ON)
endif()

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE ${KVCACHE_INSTALL_PREFIX})
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${KVCACHE_BINARY_DIR} --prefix ${KVCACHE_INSTALL_PREFIX}
    ${config_args} COMMAND_ERROR_IS_FATAL ANY)
  foreach(required IN ITEMS include/kvcache/kvcache.h include/kvcache/version.h
      ${KVCACHE_INSTALL_CMAKE_DIR}/kvcacheConfig.cmake ${KVCACHE_INSTALL_CMAKE_DIR}/kvcacheConfigVersion.cmake
      ${KVCACHE_INSTALL_CMAKE_DIR}/kvcacheTargets.cmake ${transfer_files})
    if(NOT EXISTS ${KVCACHE_INSTALL_PREFIX}/${required})
      message(FATAL_ERROR "the install lacks ${required}")
    endif()
  endforeach()
  file(GLOB libraries ${KVCACHE_INSTALL_PREFIX}/${KVCACHE_INSTALL_LIBDIR}/libkvcache.*)
  if(NOT libraries)
    message(FATAL_ERROR "the install lacks ${KVCACHE_INSTALL_LIBDIR}/libkvcache.*")
  endif()
  # The Python module is pip's to install, into site-packages: never a kvcache/ folder at the prefix root, and no
  # module file anywhere in the prefix.
  if(EXISTS ${KVCACHE_INSTALL_PREFIX}/kvcache)
    message(FATAL_ERROR "the install has a kvcache/ folder at the prefix root (the Python module belongs to pip)")
  endif()
  file(GLOB_RECURSE modules ${KVCACHE_INSTALL_PREFIX}/*_kvcache*)
  if(modules)
    message(FATAL_ERROR "the install holds the Python module: ${modules}")
  endif()
  # The installed package must work when moved: no file in it may name the source or build tree.
  file(GLOB_RECURSE package_files ${KVCACHE_INSTALL_PREFIX}/${KVCACHE_INSTALL_CMAKE_DIR}/*.cmake)
  foreach(package_file IN LISTS package_files)
    file(READ ${package_file} text)
    foreach(tree IN ITEMS ${KVCACHE_SOURCE_DIR} ${KVCACHE_BINARY_DIR})
      string(FIND "${text}" "${tree}/" position)
      if(NOT position EQUAL -1)
        message(FATAL_ERROR "${package_file} names ${tree}")
      endif()
    endforeach()
  endforeach()
  return()
endif()

if(STEP STREQUAL "build_tree")
  set(find_arg -Dkvcache_DIR=${KVCACHE_BINARY_DIR})
  set(expected_kvcache_dir ${KVCACHE_BINARY_DIR})
elseif(STEP STREQUAL "install_tree")
  set(find_arg -DCMAKE_PREFIX_PATH=${KVCACHE_INSTALL_PREFIX})
  set(expected_kvcache_dir ${KVCACHE_INSTALL_PREFIX}/${KVCACHE_INSTALL_CMAKE_DIR})
else()
  message(FATAL_ERROR "unknown STEP '${STEP}'")
endif()

set(generator_args -G ${KVCACHE_GENERATOR})
# Each setting the build had is handed on; an empty one is left out.
foreach(setting IN ITEMS
    "-A;KVCACHE_GENERATOR_PLATFORM" "-T;KVCACHE_GENERATOR_TOOLSET" "-DCMAKE_MAKE_PROGRAM=;KVCACHE_MAKE_PROGRAM"
    "-DCMAKE_CUDA_HOST_COMPILER=;KVCACHE_CUDA_HOST_COMPILER" "-Dfmt_DIR=;KVCACHE_FMT_DIR" "-DCMAKE_BUILD_TYPE=;CONFIG")
  list(GET setting 0 flag)
  list(GET setting 1 variable)
  if(NOT ${variable})
    continue()
  endif()
  if(flag MATCHES "=$")
    list(APPEND generator_args ${flag}${${variable}})
  else()
    list(APPEND generator_args ${flag} ${${variable}})
  endif()
endforeach()

set(binary_dir ${KVCACHE_DOWNSTREAM_WORK_DIR}/consumer_${STEP})
file(REMOVE_RECURSE ${binary_dir})
# The consumer may not enable CUDA, so CUDA settings it does not read are not worth a warning.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${KVCACHE_CONSUMER_SOURCE_DIR} -B ${binary_dir} --no-warn-unused-cli
    ${generator_args} ${find_arg} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DCMAKE_CXX_COMPILER=${KVCACHE_CXX_COMPILER} -DCMAKE_CUDA_COMPILER=${KVCACHE_CUDA_COMPILER}
    "-DCMAKE_CUDA_ARCHITECTURES=${KVCACHE_CUDA_ARCHITECTURES}" -DCUDAToolkit_ROOT=${KVCACHE_CUDA_TOOLKIT_ROOT}
    ${transfer_args}
  COMMAND_ERROR_IS_FATAL ANY)

file(STRINGS ${binary_dir}/CMakeCache.txt found_line REGEX "^kvcache_DIR:")
string(REGEX REPLACE "^[^=]*=" "" found_kvcache_dir "${found_line}")
file(REAL_PATH "${found_kvcache_dir}" found_kvcache_dir)
file(REAL_PATH ${expected_kvcache_dir} expected_kvcache_dir)
if(NOT found_kvcache_dir STREQUAL expected_kvcache_dir)
  message(FATAL_ERROR "the consumer found kvcache in '${found_kvcache_dir}', not in '${expected_kvcache_dir}'")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} --build ${binary_dir} ${config_args} COMMAND_ERROR_IS_FATAL ANY)

# run_consumer(<executable> <expected line>): runs one of the consumer's programs; it must exit 0 and print the line.
function(run_consumer name expected)
  set(program ${binary_dir}/${name})
  if(NOT EXISTS ${program} AND CONFIG)
    set(program ${binary_dir}/${CONFIG}/${name})
  endif()
  execute_process(COMMAND ${program} OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE result)
  message("${output}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "the consumer's ${name} failed (${result})")
  endif()
  string(FIND "${output}" "${expected}\n" position)
  if(position EQUAL -1)
    message(FATAL_ERROR "the consumer's ${name} did not print '${expected}'")
  endif()
endfunction()

run_consumer(app "kvcache ${KVCACHE_VERSION}")
if(KVCACHE_WITH_TRANSFER)
  run_consumer(transfer_app "kvcache::transfer ok")
endif()
if(KVCACHE_WITH_EVENTS)
  run_consumer(events_app "kvcache::events ok")
endif()
