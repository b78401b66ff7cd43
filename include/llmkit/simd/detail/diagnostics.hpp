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
/// GCC attributes some of these warnings to the intrinsics headers
/// themselves (e.g. `_mm512_roundscale_round_ps` inlined into xsimd's exp),
/// and a pragma covers the lines read while it is in force. So llmkit reads
/// xsimd and <immintrin.h> in one place, llmkit/simd/detail/intrinsics.hpp,
/// inside this bracket; translation units need no bracket of their own.

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
