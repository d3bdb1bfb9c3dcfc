# Package test: installs tensordict-cpp into WORK_DIR/prefix, then builds and runs the project in project/
# against it with find_package(tensordict).
#   -DINSTALL_FROM=<build dir>: installs what that build already built (`cmake --install`; what ctest does: the
#                               libraries are not compiled a second time, which cost ~11 of CI's minutes)
#   otherwise: configures and builds SOURCE_DIR in WORK_DIR/build first (libraries only; by hand)
# Run: cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<dir> [-DINSTALL_FROM=<build>] -P run_downstream.cmake
cmake_minimum_required(VERSION 3.19)
foreach(_v SOURCE_DIR WORK_DIR)
  if(NOT ${_v})
    message(FATAL_ERROR "run_downstream.cmake: pass -D${_v}=...")
  endif()
endforeach()
if(NOT DEFINED JOBS)
  set(JOBS 2)
endif()
set(_build ${WORK_DIR}/build)
set(_prefix ${WORK_DIR}/prefix)
set(_consumer ${WORK_DIR}/consumer)
file(REMOVE_RECURSE ${_prefix} ${_consumer})   # keep ${_build}: a re-run only rebuilds what changed

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "downstream: ${what} failed (${_rc}):\n${_out}")
  endif()
  message(STATUS "downstream: ${what}: ok")
  set(_last_output "${_out}" PARENT_SCOPE)
endfunction()

if(INSTALL_FROM)
  set(_build ${INSTALL_FROM})
else()
  step("configure tensordict" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${_build} -DCMAKE_BUILD_TYPE=Release
       -DTD_BUILD_TESTS=OFF -DTD_BUILD_EXAMPLES=OFF -DTD_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX=${_prefix})
  step("build tensordict" ${CMAKE_COMMAND} --build ${_build} -j${JOBS})
endif()
step("install tensordict" ${CMAKE_COMMAND} --install ${_build} --prefix ${_prefix})
step("configure downstream" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/project -B ${_consumer}
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${_prefix})
step("build downstream" ${CMAKE_COMMAND} --build ${_consumer} -j${JOBS})
step("run downstream" ${_consumer}/downstream)
message(STATUS "${_last_output}")
