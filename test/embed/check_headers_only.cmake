# SPDX-License-Identifier: Apache-2.0
# An engine that vendors Tangram (add_subdirectory, as FetchContent does) and links only
# tangram::tangram compiles no kernel, even where nvcc is found: tangram::kernels is defined (a
# target that links it builds it) but left out of the vendoring project's default build.
#   cmake -DSOURCE_DIR= -DWORK_DIR= -DGENERATOR= -DCUDA_COMPILER= -P check_headers_only.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/src)
file(WRITE ${WORK_DIR}/src/CMakeLists.txt "\
cmake_minimum_required(VERSION 3.23)
project(headers_only_engine LANGUAGES CXX)
add_subdirectory(\"${SOURCE_DIR}\" tangram)
if(NOT TARGET tangram::kernels)
  message(FATAL_ERROR \"tangram::kernels is not defined: nvcc was not found by the vendored copy\")
endif()
add_executable(engine main.cpp)
target_link_libraries(engine PRIVATE tangram::tangram)
")
file(WRITE ${WORK_DIR}/src/main.cpp "\
#include \"tangram/model/presets.hpp\"
int main() { return tangram::model_preset(\"llama-3.1-8b\").num_layers > 0 ? 0 : 1; }
")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(output "${out}${err}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} -S ${WORK_DIR}/src -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
file(GLOB_RECURSE cuda_objects ${WORK_DIR}/build/*.cu.o ${WORK_DIR}/build/*libtangram_kernels*)
if(cuda_objects)
  message(FATAL_ERROR "the headers-only engine's default build compiled kernels: ${cuda_objects}")
endif()
run(${WORK_DIR}/build/engine)
message(STATUS "a vendored copy that links only tangram::tangram compiled no .cu file")
