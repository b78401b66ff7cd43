// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/diagnostics.hpp
/// GCC 12's AVX-512 intrinsics (`_mm512_max_ps`, `_mm512_min_ps`,
/// `_mm512_cvtepi32_ps`, ...) start from `_mm512_undefined_ps()`, which
/// -Wmaybe-uninitialized reports once the intrinsic is inlined (GCC bug
/// 105593, fixed in GCC 13). The simd headers bracket their kernels with these
/// macros so users' -Wall builds stay clean; the suppression also covers the
/// kernels where they are inlined into user code. They also silence GCC's
/// -Waggressive-loop-optimizations false positive on the scalar tail loops
/// when a kernel is inlined on a fixed-size array (it cannot see that the
/// vector loop left i <= n).
///
/// GCC attributes some of these warnings to the intrinsics header itself
/// (e.g. `_mm512_roundscale_round_ps` inlined into xsimd's exp, reported in
/// the sanitizer build), so a bracket opened after <immintrin.h> was
/// included does not cover them. A translation unit where they appear
/// therefore opens the bracket before its first include and may close it
/// after its llmkit includes (src/attention_kernels_*.cpp, which instantiate
/// the attention kernels; tests/test_model.cpp; tests/simd_cases.hpp, the
/// per-arch simd tests).
///
/// Not done yet, and the better depth: each llmkit header that includes
/// <immintrin.h>, xsimd or Eigen would open its bracket before those
/// includes instead of after them (it closes at its end, so push and pop
/// stay balanced per header). Then a TU whose first SIMD include is an
/// llmkit header needs no bracket of its own. It changes some 18 headers at
/// once and wants a sanitizer run to confirm, which GCC's uneven reporting
/// makes slow to trust.

#if defined(__GNUC__) && !defined(__clang__)
#define LLMKIT_SIMD_DIAGNOSTICS_BEGIN                                  \
  _Pragma("GCC diagnostic push")                                       \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")          \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")              \
  _Pragma("GCC diagnostic ignored \"-Waggressive-loop-optimizations\"")
#define LLMKIT_SIMD_DIAGNOSTICS_END _Pragma("GCC diagnostic pop")
#else
#define LLMKIT_SIMD_DIAGNOSTICS_BEGIN
#define LLMKIT_SIMD_DIAGNOSTICS_END
#endif
