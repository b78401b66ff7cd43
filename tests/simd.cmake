# SPDX-License-Identifier: MIT
# test_simd covers every x86 arch this compiler can target: one translation
# unit per arch, each built with its own -march (given after the in-tree
# -march=native, so it wins). The kernels are templates over the arch tag, so
# the TUs share no arch-specific inline code; each TU skips its cases at run
# time when the CPU lacks the arch.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(_llmkit_simd_arch_tus
    "simd_arch_sse4_2.cpp|-march=x86-64-v2"
    "simd_arch_avx2.cpp|-march=haswell"
    "simd_arch_avx512bw.cpp|-march=skylake-avx512")
  foreach(_entry IN LISTS _llmkit_simd_arch_tus)
    string(REPLACE "|" ";" _parts "${_entry}")
    list(GET _parts 0 _file)
    list(GET _parts 1 _flags)
    set(_path "${CMAKE_CURRENT_SOURCE_DIR}/${_file}")
    target_sources(${llmkit_test_target} PRIVATE "${_path}")
    set_source_files_properties("${_path}" PROPERTIES COMPILE_OPTIONS "${_flags}")
  endforeach()
endif()

# docs/getting-started.md quotes the consumer test's program verbatim.
add_test(NAME "docs: getting-started quotes the consumer program"
  COMMAND ${CMAKE_COMMAND} -DDOC=${PROJECT_SOURCE_DIR}/docs/getting-started.md
    -DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/consumer/project/main.cpp -P ${CMAKE_CURRENT_SOURCE_DIR}/simd_doc_sync.cmake)
set_tests_properties("docs: getting-started quotes the consumer program" PROPERTIES LABELS unit)
