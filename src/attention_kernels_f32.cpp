// SPDX-License-Identifier: MIT
// The attention kernels for f32 storage, compiled once for all of llmkit's
// in-tree binaries (see include/llmkit/attention/kernels.hpp).
// The diagnostics bracket opens before <immintrin.h> is included (why:
// llmkit/simd/detail/diagnostics.hpp).
#include <llmkit/simd/detail/diagnostics.hpp>

LLMKIT_SIMD_DIAGNOSTICS_BEGIN
#include <llmkit/attention/kernels.hpp>

LLMKIT_ATTENTION_INSTANTIATE_KERNELS(float)
LLMKIT_SIMD_DIAGNOSTICS_END
