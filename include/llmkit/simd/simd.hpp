// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/simd.hpp  Umbrella header of the simd family: arch
/// selection and every vector kernel (dot, axpy/scale, sum/max/argmax, exp,
/// softmax/log_softmax, rmsnorm, RoPE, storage conversions).

#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/axpy.hpp"
#include "llmkit/simd/convert.hpp"
#include "llmkit/simd/dot.hpp"
#include "llmkit/simd/exp.hpp"
#include "llmkit/simd/reduce.hpp"
#include "llmkit/simd/rmsnorm.hpp"
#include "llmkit/simd/rope.hpp"
#include "llmkit/simd/softmax.hpp"
