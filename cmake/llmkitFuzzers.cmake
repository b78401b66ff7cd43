# SPDX-License-Identifier: MIT
# llmkit_add_fuzzer: a libFuzzer target built with clang++-14
# -fsanitize=fuzzer,address,undefined, and a ctest that runs it for
# LLMKIT_FUZZ_SECONDS from committed seeds (new inputs go to the build tree).
# Only in sanitizer builds (CMAKE_CXX_FLAGS with -fsanitize=address), and only
# when clang++-14 links libFuzzer (Debian libclang-rt-14-dev).
#
#   llmkit_add_fuzzer(NAME gguf TEST "model: gguf fuzzer"
#                     SOURCES fuzz/gguf_fuzzer.cpp ...      (relative to the project)
#                     INCLUDES examples/server ...          (relative to the project)
#                     TARGETS xsimd ...                     (their include directories)
#                     SEEDS tests/fuzz/gguf
#                     DEFINES NAME=VALUE ...)                (extra -D for this fuzzer)
include_guard(GLOBAL)
find_program(LLMKIT_CLANGXX_FUZZ NAMES clang++-14)
set(LLMKIT_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzzer runs under ctest (sanitizer builds)")

function(_llmkit_fuzzer_usable out)
  if(NOT LLMKIT_CLANGXX_FUZZ OR NOT CMAKE_CXX_FLAGS MATCHES "sanitize=address")
    set(${out} FALSE PARENT_SCOPE)
    return()
  endif()
  get_property(_known GLOBAL PROPERTY LLMKIT_FUZZER_LINKS SET)
  if(NOT _known)
    set(_dir "${PROJECT_BINARY_DIR}/fuzz-probe")
    file(WRITE "${_dir}/probe.cpp"
      "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
    execute_process(COMMAND "${LLMKIT_CLANGXX_FUZZ}" -fsanitize=fuzzer "${_dir}/probe.cpp" -o "${_dir}/probe"
                    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
    if(_rc EQUAL 0)
      set_property(GLOBAL PROPERTY LLMKIT_FUZZER_LINKS TRUE)
    else()
      set_property(GLOBAL PROPERTY LLMKIT_FUZZER_LINKS FALSE)
      message(STATUS "llmkit: clang++-14 cannot link libFuzzer (install libclang-rt-14-dev); fuzzers skipped")
    endif()
  endif()
  get_property(_links GLOBAL PROPERTY LLMKIT_FUZZER_LINKS)
  set(${out} ${_links} PARENT_SCOPE)
endfunction()

function(llmkit_add_fuzzer)
  cmake_parse_arguments(F "" "NAME;TEST;SEEDS" "SOURCES;INCLUDES;TARGETS;DEFINES" ${ARGN})
  if(TARGET llmkit_${F_NAME}_fuzzer)
    return()
  endif()
  _llmkit_fuzzer_usable(_usable)
  if(NOT _usable)
    return()
  endif()
  set(_includes "-I${PROJECT_SOURCE_DIR}/include")
  foreach(_dir IN LISTS F_INCLUDES)
    list(APPEND _includes "-I${PROJECT_SOURCE_DIR}/${_dir}")
  endforeach()
  foreach(_target IN LISTS F_TARGETS)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    foreach(_dir IN LISTS _dirs)
      # System dirs stay implicit: -isystem /usr/include breaks libstdc++'s #include_next.
      if(_dir AND NOT _dir MATCHES "^\\$<" AND NOT _dir STREQUAL "/usr/include" AND NOT _dir STREQUAL "/usr/local/include")
        list(APPEND _includes "-isystem" "${_dir}")
      endif()
    endforeach()
  endforeach()
  set(_defines "")
  foreach(_d IN LISTS F_DEFINES)
    list(APPEND _defines "-D${_d}")
  endforeach()
  set(_sources "")
  foreach(_src IN LISTS F_SOURCES)
    list(APPEND _sources "${PROJECT_SOURCE_DIR}/${_src}")
  endforeach()
  file(GLOB_RECURSE _deps CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/include/llmkit/*.hpp"
    "${PROJECT_SOURCE_DIR}/include/llmkit/*.ipp" "${PROJECT_SOURCE_DIR}/examples/server/*.hpp")
  set(_dir "${PROJECT_BINARY_DIR}/fuzz-${F_NAME}")
  file(MAKE_DIRECTORY "${_dir}" "${_dir}/corpus")
  set(_bin "${_dir}/${F_NAME}_fuzzer")
  separate_arguments(_arch UNIX_COMMAND "${LLMKIT_ARCH_FLAGS}")
  add_custom_command(OUTPUT "${_bin}"
    COMMAND "${LLMKIT_CLANGXX_FUZZ}" -std=c++20 ${_arch} -O1 -g -fno-omit-frame-pointer
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DLLMKIT_ENABLE_ASSERTS=1
            ${_defines} ${_includes} ${_sources} -o "${_bin}"
    DEPENDS ${_sources} ${_deps}
    COMMENT "Building the ${F_NAME} fuzzer with clang++-14"
    VERBATIM)
  add_custom_target(llmkit_${F_NAME}_fuzzer ALL DEPENDS "${_bin}")
  add_test(NAME "${F_TEST}"
    COMMAND "${_bin}" -max_total_time=${LLMKIT_FUZZ_SECONDS} -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
            "${_dir}/corpus" "${PROJECT_SOURCE_DIR}/${F_SEEDS}")
  set_tests_properties("${F_TEST}" PROPERTIES LABELS "fuzz" TIMEOUT 300)
endfunction()
