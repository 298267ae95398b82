# SPDX-License-Identifier: Apache-2.0
# cmake -DBUILD_DIR=<build> -DWORK_DIR=<scratch> -P check_eval_not_installed.cmake
# Installs the build into a scratch prefix and fails when any evaluation code (eval/, target
# tangram::eval) was installed or exported: engines get the library, not what measures it.
# With PREFIX set instead of BUILD_DIR it checks an existing prefix (used to test this script).
if(NOT PREFIX)
  file(REMOVE_RECURSE ${WORK_DIR})
  set(PREFIX ${WORK_DIR}/prefix)
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake --install failed (${rc}): ${err}")
  endif()
endif()

if(NOT EXISTS ${PREFIX}/include/tangram/plan/aot_mapping.hpp)
  message(FATAL_ERROR "the install holds no tangram/plan/aot_mapping.hpp: wrong prefix?")
endif()

# Every installed header whose path or name belongs to the evaluation code.
file(GLOB_RECURSE installed RELATIVE ${PREFIX} ${PREFIX}/*)
set(leaked "")
foreach(f IN LISTS installed)
  if(f MATCHES "(^|/)(eval|sim)/" OR f MATCHES "(unified_paging|split_planners|split_imbalance|split_analysis|workload(_io)?|replay|policies|cost_model)\\.hpp$")
    list(APPEND leaked ${f})
  endif()
endforeach()
# The exported targets name no evaluation target or include directory.
file(GLOB exports ${PREFIX}/lib*/cmake/tangram/*.cmake)
foreach(f IN LISTS exports)
  file(STRINGS ${f} hits REGEX "tangram_eval|tangram::eval|/eval/include")
  if(hits)
    list(APPEND leaked "${f}: ${hits}")
  endif()
endforeach()
if(leaked)
  list(JOIN leaked "\n  " text)
  message(FATAL_ERROR "evaluation code was installed or exported:\n  ${text}")
endif()
list(LENGTH installed n)
message(STATUS "no evaluation code among the ${n} installed files")
