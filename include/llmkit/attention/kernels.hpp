// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/kernels.hpp
/// Compiling the attention kernels once per program instead of once per
/// translation unit.
///
/// `prefill` and `decode` pick a kernel per head dim (and, for decode, per
/// number of query heads per pass) at run time, so every translation unit
/// that calls them compiles every kernel for each storage type it uses:
/// tens of seconds per file with optimisation, minutes under sanitizers.
/// A program with many such files can compile them once instead:
///
/// 1. define `LLMKIT_ATTENTION_EXTERN_KERNELS` for every translation unit
///    (e.g. `target_compile_definitions`): the kernels of the default arch
///    become `extern template` declarations there;
/// 2. in one translation unit per storage type (or one for all), compiled
///    with the same arch flags:
///
///        #include <llmkit/attention/kernels.hpp>
///        LLMKIT_ATTENTION_INSTANTIATE_KERNELS(float)
///
///    (types `float`, `llmkit::f16`, `llmkit::bf16`, `std::int8_t`).
///
/// Calls with an explicit arch other than the default (`decode<simd::scalar>`)
/// still compile their kernels where they are made. llmkit's own tests,
/// benchmarks and examples build this way (CMake target
/// `llmkit_kernels`, sources in src/).

#include <cstdint>

#include "llmkit/attention/decode.hpp"
#include "llmkit/attention/prefill.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/arch.hpp"

/// Explicit instantiation of the prefill and decode kernels of the default
/// arch for storage type T; use at global scope, once per program and type.
#define LLMKIT_ATTENTION_INSTANTIATE_KERNELS(T)                                                       \
  template struct llmkit::attention::detail::prefill_kernel_table<llmkit::simd::default_arch, T>;    \
  template struct llmkit::attention::detail::decode_kernel_table<llmkit::simd::default_arch, T>;
