# CTest driver: builds a libFuzzer target with clang in its own build dir and runs it briefly. A crash or
# sanitizer report fails the test. Seeds: fuzz_meta_json: every meta.json of the shared fixtures;
# fuzz_redis_meta: the metadata of the Redis fixture stores (python-store.expected.json) plus hostile variants.
# Inputs: -DSOURCE_DIR=<repo> -DWORK_DIR=<dir> -DSHARED_DIR=<shared> [-DFUZZ_TARGET=fuzz_meta_json] [-DRUNS=50000]
#         [-DSECONDS=120 (a cap)]
if(NOT FUZZ_TARGET)
  set(FUZZ_TARGET fuzz_meta_json)
endif()
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
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2 --target ${FUZZ_TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the fuzz target failed:\n${out}")
endif()
set(CORPUS ${WORK_DIR}/corpus-${FUZZ_TARGET})
file(REMOVE_RECURSE ${CORPUS})
file(MAKE_DIRECTORY ${CORPUS})
if(FUZZ_TARGET STREQUAL "fuzz_meta_json")
  file(GLOB_RECURSE seeds ${SHARED_DIR}/fixtures/*meta.json)
  list(LENGTH seeds nseeds)
  if(nseeds EQUAL 0)
    message(FATAL_ERROR "no meta.json seeds under ${SHARED_DIR}/fixtures")
  endif()
  set(i 0)
  foreach(s ${seeds})
    math(EXPR i "${i} + 1")
    configure_file(${s} ${CORPUS}/seed${i}.json COPYONLY)
  endforeach()
else()
  # fields joined by 0x01: dtype, shape, is_non_tensor, encoding, value, homogeneous, shapes, idx, count, length
  if(NOT EXISTS ${SHARED_DIR}/fixtures/redis/python-store.expected.json)
    message(FATAL_ERROR "fixture missing: ${SHARED_DIR}/fixtures/redis/python-store.expected.json")
  endif()
  string(ASCII 1 S)
  set(seed_list
    "torch.float32${S}[4, 3]${S}${S}${S}${S}${S}${S}${S}${S}"
    "torch.int64${S}[4]${S}${S}${S}${S}${S}${S}${S}${S}"
    "torch.bool${S}[4, 2]${S}${S}${S}${S}${S}${S}${S}${S}"
    "${S}${S}1${S}json${S}\"hello store\"${S}${S}${S}${S}${S}"
    "${S}${S}1${S}json_array${S}[1, null, \"a\"]${S}${S}${S}${S}${S}"
    "${S}${S}1${S}pickle${S}xyz${S}${S}${S}${S}${S}"
    "torch.float32${S}[2, 3]${S}${S}${S}${S}0${S}[[3], [5]]${S}idx${S}2${S}32"
    "torch.int64${S}[2]${S}${S}${S}${S}1${S}${S}${S}2${S}16"
    "torch.float64${S}[9223372036854775807, 2]${S}${S}${S}${S}${S}${S}${S}${S}"
    "torch.complex64${S}[-1]${S}${S}${S}${S}${S}${S}${S}${S}")
  set(i 0)
  foreach(s ${seed_list})
    math(EXPR i "${i} + 1")
    file(WRITE ${CORPUS}/seed${i} "${s}")
  endforeach()
endif()
# a fixed seed and run count keep CI repeatable; explore longer by hand with -max_total_time
execute_process(COMMAND ${WORK_DIR}/build/tests/fuzz/${FUZZ_TARGET} -seed=1 -runs=${RUNS} -max_total_time=${SECONDS} -rss_limit_mb=4096
                        -print_final_stats=1 ${CORPUS}
                WORKING_DIRECTORY ${WORK_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${out}")
message(STATUS "${FUZZ_TARGET}: ${runs}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZ_TARGET} found a problem (exit ${rc}):\n${out}")
endif()
