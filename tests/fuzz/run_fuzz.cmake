# CTest driver: builds a libFuzzer target with clang in its own build dir and runs it briefly from a seed corpus.
# A crash or sanitizer report fails the test.
# Inputs: -DSOURCE_DIR=<repo> -DWORK_DIR=<dir> -DSHARED_DIR=<shared> [-DFUZZ_TARGET=fuzz_meta_json] [-DRUNS=50000]
#         [-DSECONDS=120 (a cap)] [-DEXTRA_ARGS=<;-list of libFuzzer flags>] [-DEXTRA_ENV=<;-list of VAR=value>]
# Seeds: fuzz_meta_json: every meta.json of the shared fixtures.
#        fuzz_h5_open: the fixtures' .h5 files, files written by h5py (/usr/bin/python3, required) and by the
#        store itself (TD_FUZZ_H5_SEED_OUT), and the regression inputs tests/fuzz/h5_findings/fixed-*.h5.
#        fuzz_redis_meta: the metadata of the Redis fixture stores plus hostile variants (written here).
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
set(fuzzer ${WORK_DIR}/build/tests/fuzz/${FUZZ_TARGET})
set(corpus ${WORK_DIR}/corpus-${FUZZ_TARGET})
file(REMOVE_RECURSE ${corpus})
file(MAKE_DIRECTORY ${corpus})
if(FUZZ_TARGET STREQUAL "fuzz_meta_json")
  file(GLOB_RECURSE seeds ${SHARED_DIR}/fixtures/*meta.json)
  set(ext json)
elseif(FUZZ_TARGET STREQUAL "fuzz_h5_open")
  file(GLOB_RECURSE seeds ${SHARED_DIR}/fixtures/*.h5)
  file(GLOB fixed ${CMAKE_CURRENT_LIST_DIR}/h5_findings/fixed-*.h5)
  list(APPEND seeds ${fixed})
  set(ext h5)
  # files in the layout the store writes, through h5py (the same layout; see tests/backends/test_h5_store.cpp)
  if(NOT EXISTS /usr/bin/python3)
    message(FATAL_ERROR "fuzz_h5_open seeds need /usr/bin/python3 with h5py (python3-h5py)")
  endif()
  execute_process(COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/h5_seeds.py ${corpus}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "writing the h5 seeds failed (is python3-h5py installed?):\n${out}")
  endif()
  # and one written by the store itself (the target writes it at start-up; -runs=0: no fuzzing)
  file(MAKE_DIRECTORY ${WORK_DIR}/empty-corpus)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env TD_FUZZ_H5_SEED_OUT=${corpus}/seed_store.h5 ${fuzzer} -runs=0
                          ${WORK_DIR}/empty-corpus
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT EXISTS ${corpus}/seed_store.h5)
    message(FATAL_ERROR "writing the store's h5 seed failed:\n${out}")
  endif()
elseif(FUZZ_TARGET STREQUAL "fuzz_redis_meta")
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
    file(WRITE ${corpus}/seed${i} "${s}")
  endforeach()
elseif(FUZZ_TARGET STREQUAL "fuzz_shm_handle")
  # valid tensor and tensordict handles, written by the target itself (-runs=0: no fuzzing)
  file(MAKE_DIRECTORY ${WORK_DIR}/empty-corpus)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env TD_FUZZ_SEED_DIR=${corpus} ${fuzzer} -runs=0 ${WORK_DIR}/empty-corpus
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT EXISTS ${corpus}/tensordict.bin)
    message(FATAL_ERROR "writing the shm handle seeds failed:\n${out}")
  endif()
elseif(FUZZ_TARGET STREQUAL "fuzz_config")
  set(seeds ${SOURCE_DIR}/config/default_config.json)
  set(ext json)
  file(WRITE ${corpus}/partial.json "{\"workers\": 3, \"redis\": {\"port\": 6380}}")
elseif(FUZZ_TARGET STREQUAL "fuzz_pickle_plain")
  # metadata records as torch.distributed pickles them (Debian's python3, protocols 2 to 5), and a class reference
  if(NOT EXISTS /usr/bin/python3)
    message(FATAL_ERROR "fuzz_pickle_plain seeds need /usr/bin/python3")
  endif()
  execute_process(COMMAND /usr/bin/python3 -c "
import pickle, sys, collections
rec = {'cls': 'TensorDict', 'non_tensors': {'label': ('hello', [3], None)},
       'leaves': {'a': ('torch.float32', [3], 0, 16, 4), 'c': ('torch.float32', [3, 2], 16, 40, 0)},
       'cls_metadata': {'device': None, 'names': [None], 'batch_size': [3], 'is_locked': False},
       'nested': {'cls': 'TensorDict', 'non_tensors': {}, 'leaves': {'x': ('torch.int64', [3], 40, 64, 0)},
                  'cls_metadata': {'device': 'cpu', 'names': [None], 'batch_size': [3], 'is_locked': True}},
       '_total_bytes': 64, 'big': 2**40, 'neg': -7, 'f': 1.5, 'b': b'raw'}
for p in range(2, 6):
    open(sys.argv[1] + '/seed%d.pkl' % p, 'wb').write(pickle.dumps(rec, protocol=p))
open(sys.argv[1] + '/class.pkl', 'wb').write(pickle.dumps(collections.OrderedDict(a=1)))
" ${corpus} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "writing the pickle seeds failed:\n${out}")
  endif()
else()
  message(FATAL_ERROR "unknown fuzz target ${FUZZ_TARGET}")
endif()
list(LENGTH seeds nseeds)
if(nseeds EQUAL 0 AND NOT FUZZ_TARGET MATCHES "fuzz_redis_meta|fuzz_shm_handle|fuzz_pickle_plain")  # those seeds are written above
  message(FATAL_ERROR "no ${ext} seeds under ${SHARED_DIR}/fixtures")
endif()
set(i 0)
foreach(s ${seeds})
  math(EXPR i "${i} + 1")
  configure_file(${s} ${corpus}/seed${i}.${ext} COPYONLY)
endforeach()
# a fixed seed and run count keep CI repeatable; explore longer by hand with -max_total_time
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${EXTRA_ENV} ${fuzzer} -seed=1 -runs=${RUNS} -max_total_time=${SECONDS}
                        -rss_limit_mb=4096 -print_final_stats=1 ${EXTRA_ARGS} ${corpus}
                WORKING_DIRECTORY ${WORK_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${out}")
message(STATUS "${FUZZ_TARGET}: ${runs}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZ_TARGET} found a problem (exit ${rc}):\n${out}")
endif()
