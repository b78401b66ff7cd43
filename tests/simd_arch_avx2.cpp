// SPDX-License-Identifier: MIT
// The simd kernel tests for xsimd::fma3<xsimd::avx2>; compiled with that arch's -march flags by
// tests/simd.cmake and linked into test_simd.
#define LLMKIT_TEST_ARCH xsimd::fma3<xsimd::avx2>
#define LLMKIT_TEST_ARCH_NAME "fma3+avx2"
#define LLMKIT_TEST_ARCH_AVAILABLE (xsimd::available_architectures().fma3_avx2 != 0)
#include "simd_cases.hpp"
