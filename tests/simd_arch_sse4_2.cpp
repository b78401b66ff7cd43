// SPDX-License-Identifier: MIT
// The simd kernel tests for xsimd::sse4_2; compiled with that arch's -march flags by
// tests/simd.cmake and linked into test_simd.
#define LLMKIT_TEST_ARCH xsimd::sse4_2
#define LLMKIT_TEST_ARCH_NAME "sse4.2"
#define LLMKIT_TEST_ARCH_AVAILABLE (xsimd::available_architectures().sse4_2 != 0)
#include "simd_cases.hpp"
