// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/kernels.hpp
/// Compiling the model's product kernels once per program instead of once
/// per translation unit.
///
/// Every translation unit that runs a model (or calls `linear`) compiles
/// the register-tiled kernels of every weight storage it may meet, a large
/// share of its compile time. A program with many such files can compile
/// them once instead:
///
/// 1. define `LLMKIT_MODEL_EXTERN_KERNELS` for every translation unit
///    (e.g. `target_compile_definitions`): the kernels of the default arch
///    become `extern template` declarations there;
/// 2. in one translation unit, compiled with the same arch flags:
///
///        #include <llmkit/model/kernels.hpp>
///        LLMKIT_MODEL_INSTANTIATE_KERNELS()
///
/// Calls with an explicit arch other than the default (`linear<simd::scalar>`)
/// still compile their kernels where they are made. llmkit's own tests,
/// benchmarks and examples build this way (CMake target `llmkit_kernels`,
/// src/model_kernels.cpp), as they do the attention kernels
/// (attention/kernels.hpp).

#include "llmkit/model/detail/matmul_kernels.hpp"
#include "llmkit/simd/arch.hpp"

/// Explicit instantiation of the product kernels of the default arch; use at
/// global scope, once per program.
#define LLMKIT_MODEL_INSTANTIATE_KERNELS() \
  template struct llmkit::model::detail::matmul_kernels<llmkit::simd::default_arch>;
