# SPDX-License-Identifier: Apache-2.0
# cmake -DDIR=<folder with _tangram.pyi and, in CUDA builds, cuda.pyi> -P fix_stubs.cmake
# The stubs are generated with the extension imported as a top-level `_tangram`; inside the
# installed package it is `tangram._tangram`, so absolute imports of it become relative.
foreach(stub ${DIR}/_tangram.pyi ${DIR}/cuda.pyi)
  if(EXISTS ${stub})
    file(READ ${stub} text)
    string(REPLACE "from _tangram import " "from . import " text "${text}")
    string(REGEX REPLACE "(^|\n)import _tangram(\n|$)" "\\1from . import _tangram\\2" text "${text}")
    file(WRITE ${stub} "${text}")
  endif()
endforeach()
