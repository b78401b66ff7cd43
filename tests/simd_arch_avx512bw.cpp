// SPDX-License-Identifier: MIT
// The simd kernel tests for xsimd::avx512bw; compiled with that arch's -march flags by
// tests/simd.cmake and linked into test_simd.
#define LLMKIT_TEST_ARCH xsimd::avx512bw
#define LLMKIT_TEST_ARCH_NAME "avx512bw"
#define LLMKIT_TEST_ARCH_AVAILABLE (xsimd::available_architectures().avx512bw != 0)
#include "simd_cases.hpp"
