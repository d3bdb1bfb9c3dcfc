# Finds the libraries tensordict-cpp builds on. Included by the top-level CMakeLists.txt and by the
# installed tensordictConfig.cmake, so a downstream project resolves the same imported targets.
include(CMakeFindDependencyMacro)
find_package(Threads REQUIRED)
find_package(Torch REQUIRED)
find_package(RapidJSON REQUIRED)
if(NOT TARGET tensordict_rapidjson)
  add_library(tensordict_rapidjson INTERFACE IMPORTED)
  set_target_properties(tensordict_rapidjson PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${RAPIDJSON_INCLUDE_DIRS}")
endif()
