// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/intrinsics.hpp
/// The one place llmkit includes xsimd and <immintrin.h>. Every llmkit
/// header that needs either includes this header instead.
///
/// The includes sit inside the diagnostics bracket
/// (llmkit/simd/detail/diagnostics.hpp) because GCC 12 attributes some of
/// its false positives to lines of the intrinsics headers themselves (e.g.
/// `_mm512_roundscale_round_ps`, inlined into xsimd's exp), and a pragma
/// applies to the lines read while it is in force. Reading those headers
/// here, inside the bracket, covers their lines wherever they are inlined,
/// so a translation unit needs no bracket of its own as long as its first
/// include of <immintrin.h> (directly, or through xsimd or Eigen) is an
/// llmkit header.
///
/// It also defines `LLMKIT_SIMD_X86` (to 1) when compiling for x86, where
/// <immintrin.h> is included (docs/getting-started.md, "Configuration
/// macros"); the simd headers guard each instruction set's overloads with
/// the compiler's own macro (`__AVX2__`, `__AVX512F__`, ...).

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN
#include <xsimd/xsimd.hpp>
#if defined(__x86_64__) || defined(__i386__)
#define LLMKIT_SIMD_X86 1
#include <immintrin.h>
#endif
LLMKIT_SIMD_DIAGNOSTICS_END
