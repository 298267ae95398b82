# SPDX-License-Identifier: Apache-2.0
# tangram_target_defaults(<target>): warnings, optional -Werror and sanitizers for Tangram's own
# programs (tests, tools, benchmarks). Never applied to the library targets consumers link.
function(tangram_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wpedantic>)
  if(TANGRAM_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(TANGRAM_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${TANGRAM_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PRIVATE -fsanitize=${TANGRAM_SANITIZE})
  endif()
endfunction()
