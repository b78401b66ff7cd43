// SPDX-License-Identifier: MIT
// The attention kernels for bf16 storage, compiled once for all of llmkit's
// in-tree binaries (see include/llmkit/attention/kernels.hpp).
//
// The diagnostics bracket opens before anything includes <immintrin.h>: GCC
// 12 reports its own AVX-512 intrinsics as reading an uninitialized value
// once they are inlined into xsimd's exp (GCC bug 105593, seen in the
// sanitizer build), and it attributes the warning to the intrinsics header,
// so only a bracket around that header's inclusion covers it.
#include <llmkit/simd/detail/diagnostics.hpp>

LLMKIT_SIMD_DIAGNOSTICS_BEGIN
#include <llmkit/attention/kernels.hpp>

LLMKIT_ATTENTION_INSTANTIATE_KERNELS(llmkit::bf16)
LLMKIT_SIMD_DIAGNOSTICS_END
