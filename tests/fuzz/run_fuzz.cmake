# CTest driver: builds the libFuzzer targets with clang in their own build dir and runs each briefly,
# seeded with every meta.json of the shared fixtures. A crash or sanitizer report fails the test.
# Inputs: -DSOURCE_DIR=<repo> -DWORK_DIR=<dir> -DSHARED_DIR=<shared> [-DRUNS=50000] [-DSECONDS=120 (a cap)]
if(NOT SECONDS)
  set(SECONDS 120)
endif()
if(NOT RUNS)
  set(RUNS 50000)
endif()
find_program(CLANGXX NAMES clang++ clang++-14 REQUIRED)
find_program(CLANGC NAMES clang clang-14 REQUIRED)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
                        -DCMAKE_C_COMPILER=${CLANGC} -DCMAKE_CXX_COMPILER=${CLANGXX}
                        -DTD_BUILD_FUZZ=ON -DTD_BUILD_TESTS=OFF -DTD_BUILD_EXAMPLES=OFF -DTD_BUILD_BENCH=OFF
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the fuzz build failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2 --target fuzz_meta_json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the fuzz target failed:\n${out}")
endif()
file(REMOVE_RECURSE ${WORK_DIR}/corpus)
file(MAKE_DIRECTORY ${WORK_DIR}/corpus)
file(GLOB_RECURSE seeds ${SHARED_DIR}/fixtures/*meta.json)
list(LENGTH seeds nseeds)
if(nseeds EQUAL 0)
  message(FATAL_ERROR "no meta.json seeds under ${SHARED_DIR}/fixtures")
endif()
set(i 0)
foreach(s ${seeds})
  math(EXPR i "${i} + 1")
  configure_file(${s} ${WORK_DIR}/corpus/seed${i}.json COPYONLY)
endforeach()
# a fixed seed and run count keep CI repeatable; explore longer by hand with -max_total_time
execute_process(COMMAND ${WORK_DIR}/build/tests/fuzz/fuzz_meta_json -seed=1 -runs=${RUNS} -max_total_time=${SECONDS} -rss_limit_mb=4096
                        -print_final_stats=1 ${WORK_DIR}/corpus
                WORKING_DIRECTORY ${WORK_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${out}")
message(STATUS "fuzz_meta_json: ${runs}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fuzz_meta_json found a problem (exit ${rc}):\n${out}")
endif()
