// SPDX-License-Identifier: MIT
// The simd kernels on the scalar path and on the default (compile-time) arch;
// tests/simd.cmake adds one more translation unit per x86 arch.
#define LLMKIT_TEST_ARCH llmkit::simd::scalar
#define LLMKIT_TEST_ARCH_NAME "scalar"
#define LLMKIT_TEST_ARCH_AVAILABLE true
#include "simd_cases.hpp"
