# SPDX-License-Identifier: MIT
# test_server_protocol tests llmkit-server's protocol code (examples/server/),
# pure functions: no model, no kernels, no sockets.
include("${PROJECT_SOURCE_DIR}/examples/server/protocol.cmake")
set(llmkit_test_link llmkit_server_protocol)
list(APPEND llmkit_test_labels server)
# The tokenization tests read the vendored stories260K (tokenizer only).
target_compile_definitions(${llmkit_test_target} PRIVATE
  LLMKIT_DEFAULT_MODEL="${PROJECT_SOURCE_DIR}/models/stories260K.gguf")

# The libFuzzer target for the protocol (fuzz/protocol_fuzzer.cpp): request
# bodies of either API to a checked request or a 4xx, and a chat's prompt
# with control tokens only in the template's text. Built and run like the
# GGUF fuzzer (tests/model.cmake): with clang++-14
# -fsanitize=fuzzer,address,undefined in sanitizer builds, for
# LLMKIT_FUZZ_SECONDS from the seeds in tests/fuzz/protocol/ (new inputs go
# to the build tree).
find_program(LLMKIT_CLANGXX_FUZZ NAMES clang++-14)
set(LLMKIT_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzzer runs under ctest (sanitizer builds)")
if(TARGET llmkit_protocol_fuzzer OR NOT LLMKIT_CLANGXX_FUZZ OR NOT CMAKE_CXX_FLAGS MATCHES "sanitize=address")
  return()
endif()
set(_pfuzz_dir "${CMAKE_CURRENT_BINARY_DIR}/fuzz-protocol")
file(MAKE_DIRECTORY "${_pfuzz_dir}")
file(WRITE "${_pfuzz_dir}/probe.cpp"
  "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
execute_process(
  COMMAND "${LLMKIT_CLANGXX_FUZZ}" -fsanitize=fuzzer "${_pfuzz_dir}/probe.cpp" -o "${_pfuzz_dir}/probe"
  RESULT_VARIABLE _pfuzz_probe_result OUTPUT_QUIET ERROR_QUIET)
if(NOT _pfuzz_probe_result EQUAL 0)
  message(STATUS "llmkit: clang++-14 cannot link libFuzzer (install libclang-rt-14-dev); protocol fuzzer skipped")
  return()
endif()

get_target_property(_pfuzz_xsimd_inc xsimd INTERFACE_INCLUDE_DIRECTORIES)
get_target_property(_pfuzz_json_inc nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
set(_pfuzz_includes "-I${PROJECT_SOURCE_DIR}/include" "-I${PROJECT_SOURCE_DIR}/examples/server")
foreach(_dir IN LISTS _pfuzz_xsimd_inc _pfuzz_json_inc)
  # System dirs stay implicit: -isystem /usr/include breaks libstdc++'s #include_next.
  if(_dir AND NOT _dir MATCHES "^\\$<" AND NOT _dir STREQUAL "/usr/include" AND NOT _dir STREQUAL "/usr/local/include")
    list(APPEND _pfuzz_includes "-isystem" "${_dir}")
  endif()
endforeach()
file(GLOB_RECURSE _pfuzz_deps CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/include/llmkit/*.hpp"
  "${PROJECT_SOURCE_DIR}/include/llmkit/*.ipp" "${PROJECT_SOURCE_DIR}/examples/server/*.hpp")
set(_pfuzz_bin "${_pfuzz_dir}/protocol_fuzzer")
separate_arguments(_pfuzz_arch UNIX_COMMAND "${LLMKIT_ARCH_FLAGS}")
add_custom_command(OUTPUT "${_pfuzz_bin}"
  COMMAND "${LLMKIT_CLANGXX_FUZZ}" -std=c++20 ${_pfuzz_arch} -O1 -g -fno-omit-frame-pointer
          -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DLLMKIT_ENABLE_ASSERTS=1
          ${_pfuzz_includes} "${PROJECT_SOURCE_DIR}/fuzz/protocol_fuzzer.cpp"
          "${PROJECT_SOURCE_DIR}/examples/server/openai_protocol.cpp" -o "${_pfuzz_bin}"
  DEPENDS "${PROJECT_SOURCE_DIR}/fuzz/protocol_fuzzer.cpp" "${PROJECT_SOURCE_DIR}/examples/server/openai_protocol.cpp"
          ${_pfuzz_deps}
  COMMENT "Building the protocol fuzzer with clang++-14"
  VERBATIM)
add_custom_target(llmkit_protocol_fuzzer ALL DEPENDS "${_pfuzz_bin}")
set(_pfuzz_corpus "${CMAKE_CURRENT_BINARY_DIR}/fuzz-corpus-protocol")
file(MAKE_DIRECTORY "${_pfuzz_corpus}")
add_test(NAME "server: protocol fuzzer"
  COMMAND "${_pfuzz_bin}" -max_total_time=${LLMKIT_FUZZ_SECONDS} -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
          "${_pfuzz_corpus}" "${CMAKE_CURRENT_SOURCE_DIR}/fuzz/protocol")
set_tests_properties("server: protocol fuzzer" PROPERTIES LABELS "fuzz" TIMEOUT 300)
