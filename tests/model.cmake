# SPDX-License-Identifier: MIT
# Included once per test_model*.cpp target (llmkit_test_target). Adds, once,
# the libFuzzer target for the GGUF reader: built with clang++-14
# -fsanitize=fuzzer,address,undefined when clang++-14 and libFuzzer are
# available, and run for LLMKIT_FUZZ_SECONDS (default 20) by ctest in
# sanitizer builds (CMAKE_CXX_FLAGS containing -fsanitize=address), starting
# from the seeds in tests/fuzz/gguf/ (new inputs go to the build tree).
if(TARGET llmkit_gguf_fuzzer)
  return()
endif()
find_program(LLMKIT_CLANGXX_FUZZ NAMES clang++-14)
set(LLMKIT_FUZZ_SECONDS 20 CACHE STRING "Seconds the GGUF fuzzer runs under ctest (sanitizer builds)")
if(NOT LLMKIT_CLANGXX_FUZZ OR NOT CMAKE_CXX_FLAGS MATCHES "sanitize=address")
  return()
endif()
# libFuzzer ships in libclang-rt-14-dev; check it links before relying on it.
set(_fuzz_probe_dir "${CMAKE_CURRENT_BINARY_DIR}/fuzz-probe")
file(WRITE "${_fuzz_probe_dir}/probe.cpp"
  "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
execute_process(
  COMMAND "${LLMKIT_CLANGXX_FUZZ}" -fsanitize=fuzzer "${_fuzz_probe_dir}/probe.cpp" -o "${_fuzz_probe_dir}/probe"
  RESULT_VARIABLE _fuzz_probe_result OUTPUT_QUIET ERROR_QUIET)
if(NOT _fuzz_probe_result EQUAL 0)
  message(STATUS "llmkit: clang++-14 cannot link libFuzzer (install libclang-rt-14-dev); GGUF fuzzer skipped")
  return()
endif()

get_target_property(_xsimd_inc xsimd INTERFACE_INCLUDE_DIRECTORIES)
set(_fuzz_includes "-I${PROJECT_SOURCE_DIR}/include")
foreach(_dir IN LISTS _xsimd_inc)
  # System dirs stay implicit: -isystem /usr/include breaks libstdc++'s #include_next.
  if(_dir AND NOT _dir MATCHES "^\\$<" AND NOT _dir STREQUAL "/usr/include" AND NOT _dir STREQUAL "/usr/local/include")
    list(APPEND _fuzz_includes "-isystem" "${_dir}")
  endif()
endforeach()
file(GLOB_RECURSE _fuzz_deps CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/include/llmkit/*.hpp"
  "${PROJECT_SOURCE_DIR}/include/llmkit/*.ipp")
set(_fuzz_bin "${CMAKE_CURRENT_BINARY_DIR}/fuzz-gguf/gguf_fuzzer")
file(MAKE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/fuzz-gguf")
separate_arguments(_fuzz_arch UNIX_COMMAND "${LLMKIT_ARCH_FLAGS}")
add_custom_command(OUTPUT "${_fuzz_bin}"
  COMMAND "${LLMKIT_CLANGXX_FUZZ}" -std=c++20 ${_fuzz_arch} -O1 -g -fno-omit-frame-pointer
          -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DLLMKIT_ENABLE_ASSERTS=1
          ${_fuzz_includes} "${PROJECT_SOURCE_DIR}/fuzz/gguf_fuzzer.cpp" -o "${_fuzz_bin}"
  DEPENDS "${PROJECT_SOURCE_DIR}/fuzz/gguf_fuzzer.cpp" ${_fuzz_deps}
  COMMENT "Building the GGUF fuzzer with clang++-14"
  VERBATIM)
add_custom_target(llmkit_gguf_fuzzer ALL DEPENDS "${_fuzz_bin}")
set(_fuzz_corpus "${CMAKE_CURRENT_BINARY_DIR}/fuzz-corpus-gguf")
file(MAKE_DIRECTORY "${_fuzz_corpus}")
add_test(NAME "model: gguf fuzzer"
  COMMAND "${_fuzz_bin}" -max_total_time=${LLMKIT_FUZZ_SECONDS} -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
          "${_fuzz_corpus}" "${CMAKE_CURRENT_SOURCE_DIR}/fuzz/gguf")
set_tests_properties("model: gguf fuzzer" PROPERTIES LABELS "fuzz" TIMEOUT 300)
