# The header rules (docs/design.md, "Layers"), in CMake script mode:
#   cmake -DROOT=<source dir> -P cmake/check_headers.cmake
# 1. Layers: the folders of include/tangram/ and eval/include/tangram/ are layers, listed bottom
#    first in TANGRAM_LAYERS; a header includes only headers of its own layer and of the layers
#    listed before it. A header's layer is the longest entry that prefixes its path (tangram/<path>;
#    a folder's detail/ belongs to it); "." is the umbrella tangram.hpp. Every #include "..." line
#    counts, also inside #if blocks, and must be written "tangram/...". Direct includes suffice: in
#    a total order an upward path needs an upward edge. A header in a folder of no layer fails.
# 2. @file: the @file line of each of these headers names its path under tangram/.
# 3. Size: no header of the project (.hpp .cuh .inl .h, tests and tools included) over 700 lines;
#    the memory manager's facade (memory/kv_cache_manager.hpp) at most 600.
# Fails with one line per violation. Checked by ctest headers:layers and by the default build
# (target tangram_header_rules); test/headers/ holds the fixture that proves it fails.
cmake_minimum_required(VERSION 3.23)
set(TANGRAM_LAYERS
    core kernels reference model profile plan memory device interop
    eval/baselines eval eval/sim io eval/io .)
set(max_lines 700)
set(facade tangram/memory/kv_cache_manager.hpp)
set(facade_max_lines 600)

if(NOT DEFINED ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_headers.cmake")
endif()
get_filename_component(ROOT "${ROOT}" ABSOLUTE)
# layer_of(<path under tangram/> <out>): index in TANGRAM_LAYERS, or -1.
function(layer_of path out)
  set(best -1)
  set(best_length -1)
  set(i 0)
  foreach(layer IN LISTS TANGRAM_LAYERS)
    set(hit FALSE)
    if(layer STREQUAL ".")
      if(NOT path MATCHES "/")
        set(hit TRUE)
      endif()
    else()
      string(FIND "${path}" "${layer}/" at)
      if(at EQUAL 0)
        set(hit TRUE)
      endif()
    endif()
    string(LENGTH "${layer}" length)
    if(hit AND length GREATER best_length)
      set(best ${i})
      set(best_length ${length})
    endif()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out} ${best} PARENT_SCOPE)
endfunction()

set(errors "")
foreach(base include/tangram eval/include/tangram)
  file(GLOB_RECURSE headers RELATIVE "${ROOT}/${base}" "${ROOT}/${base}/*.hpp" "${ROOT}/${base}/*.cuh"
       "${ROOT}/${base}/*.inl")
  list(SORT headers)
  foreach(h IN LISTS headers)
    layer_of("${h}" mine)
    if(mine EQUAL -1)
      string(APPEND errors "  tangram/${h}: in no layer (give its folder a place in TANGRAM_LAYERS)\n")
      continue()
    endif()
    list(GET TANGRAM_LAYERS ${mine} my_name)
    file(STRINGS "${ROOT}/${base}/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"|@file ")
    set(named FALSE)
    foreach(line IN LISTS lines)
      if(line MATCHES "@file ([^ \t]+)")
        if(CMAKE_MATCH_1 STREQUAL h)
          set(named TRUE)
        endif()
        continue()
      endif()
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*" "\\1" included "${line}")
      if(NOT included MATCHES "^tangram/(.*)$")
        string(APPEND errors "  tangram/${h}: includes \"${included}\" (write \"tangram/...\")\n")
        continue()
      endif()
      layer_of("${CMAKE_MATCH_1}" theirs)
      if(theirs GREATER mine)
        list(GET TANGRAM_LAYERS ${theirs} their_name)
        string(APPEND errors
               "  tangram/${h} (${my_name}) includes ${included} (${their_name}, above it)\n")
      endif()
    endforeach()
    if(NOT named)
      string(APPEND errors "  tangram/${h}: no \"@file ${h}\" line\n")
    endif()
  endforeach()
endforeach()

set(all_headers "")
foreach(dir include eval test tools bench fuzz python examples kernels)
  file(GLOB_RECURSE found RELATIVE "${ROOT}" "${ROOT}/${dir}/*.hpp" "${ROOT}/${dir}/*.cuh"
       "${ROOT}/${dir}/*.inl" "${ROOT}/${dir}/*.h")
  list(APPEND all_headers ${found})
endforeach()
list(SORT all_headers)
foreach(h IN LISTS all_headers)
  if(h MATCHES "^test/headers/")  # the fixture of headers:layers_fails
    continue()
  endif()
  file(READ "${ROOT}/${h}" text)
  string(REGEX REPLACE "[^\n]" "" newlines "${text}")
  string(LENGTH "${newlines}" n)
  set(limit ${max_lines})
  if(h MATCHES "/${facade}$")
    set(limit ${facade_max_lines})
  endif()
  if(n GREATER limit)
    string(APPEND errors "  ${h}: ${n} lines (at most ${limit}; split it by job)\n")
  endif()
endforeach()

if(errors)
  string(REPLACE ";" " < " order "${TANGRAM_LAYERS}")
  message(FATAL_ERROR "header rules (docs/design.md, Layers) broken:\n${errors}"
                      "layers, bottom first: ${order}")
endif()
message(STATUS "header rules: ok (layers, @file, size)")
