# SPDX-License-Identifier: Apache-2.0
# cmake -DMODE=install|fetchcontent -DSOURCE_DIR= -DBUILD_DIR= -DWORK_DIR= -DCONSUMER_DIR= -P run_consumer.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
      -DTANGRAM_CONSUMER_MODE=install -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  # The vendored copy builds headers only (tests, tools and benchmarks default off when not top
  # level); kernels are left off here because the install test already links them.
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
      -DTANGRAM_CONSUMER_MODE=fetchcontent -DTANGRAM_SOURCE=${SOURCE_DIR} -DTANGRAM_ENABLE_CUDA=OFF)
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
