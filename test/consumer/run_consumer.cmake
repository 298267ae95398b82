# SPDX-License-Identifier: Apache-2.0
# cmake -DMODE=install|fetchcontent (also the README's FetchContent snippet, via a local git URL) -DSOURCE_DIR= -DBUILD_DIR= -DWORK_DIR= -DCONSUMER_DIR= -P run_consumer.cmake
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

if(MODE STREQUAL "fetchcontent")
  # The README's FetchContent snippet exactly as printed (issue 31: a trailing SYSTEM broke it on
  # CMake 3.25.1), its placeholders filled with a local git URL: a repository of this source tree
  # as git would commit it (ignored build folders left out), and its commit.
  find_program(GIT git REQUIRED)
  set(repo ${WORK_DIR}/repo.git)
  set(git_tree ${GIT} --git-dir=${repo} --work-tree=${SOURCE_DIR})
  run(${GIT} init -q --bare ${repo})
  run(${git_tree} add -A)
  run(${git_tree} -c user.name=consumer -c user.email=consumer@localhost commit -q -m snapshot)
  execute_process(COMMAND ${GIT} --git-dir=${repo} rev-parse HEAD OUTPUT_VARIABLE commit
                  OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  file(READ ${SOURCE_DIR}/README.md readme)
  string(REGEX MATCH "With FetchContent[^\n]*\n\n```cmake\n([^`]*)```" found "${readme}")
  set(snippet "${CMAKE_MATCH_1}")
  if(NOT found OR NOT snippet MATCHES "FetchContent_Declare")
    message(FATAL_ERROR "README.md: no ```cmake block after \"With FetchContent\"")
  endif()
  string(REPLACE "<url-of-this-repo>" "file://${repo}" snippet "${snippet}")
  string(REPLACE "<commit>" "${commit}" snippet "${snippet}")
  if(snippet MATCHES "<[a-z-]+>")
    message(FATAL_ERROR "README.md's snippet has a placeholder this test does not fill:\n${snippet}")
  endif()
  set(readme_dir ${WORK_DIR}/readme-snippet)
  file(WRITE ${readme_dir}/CMakeLists.txt
       "cmake_minimum_required(VERSION 3.25)\n"
       "project(readme_snippet LANGUAGES CXX)\n"
       "add_executable(my_engine ${CONSUMER_DIR}/main.cpp)\n"
       "${snippet}"
       "target_compile_definitions(my_engine PRIVATE TANGRAM_DATA_DIR=\"\${TANGRAM_DATA_DIR}\")\n")
  run(${CMAKE_COMMAND} -S ${readme_dir} -B ${readme_dir}/build -DCMAKE_BUILD_TYPE=Release
      -DTANGRAM_ENABLE_CUDA=OFF)
  run(${CMAKE_COMMAND} --build ${readme_dir}/build)
  run(${readme_dir}/build/my_engine)
endif()
