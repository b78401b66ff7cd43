# SPDX-License-Identifier: MIT
# Included once per test_model*.cpp target (llmkit_test_target). Adds, once,
# the libFuzzer target for the GGUF reader (cmake/llmkitFuzzers.cmake: sanitizer
# builds with clang++-14), from the seeds in tests/fuzz/gguf/.
include("${PROJECT_SOURCE_DIR}/cmake/llmkitFuzzers.cmake")
llmkit_add_fuzzer(NAME gguf TEST "model: gguf fuzzer" SOURCES fuzz/gguf_fuzzer.cpp TARGETS xsimd SEEDS tests/fuzz/gguf)
