// SPDX-License-Identifier: MIT
#pragma once

// Checks shared by the prefill and decode tests (Catch2).

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>
#include <xsimd/xsimd.hpp>

#include <llmkit/attention/head_dims.hpp>
#include <llmkit/core/dtype.hpp>

#include "reference/attention_reference.hpp"

namespace llmkit::test {

/// True when this CPU runs `xsimd::fma3<xsimd::avx2>` kernels; else warns
/// that the calling test is skipped.
inline bool avx2_fma_available() {
  if (xsimd::available_architectures().fma3_avx2 != 0) return true;
  WARN("this CPU has no AVX2 + FMA: skipped");
  return false;
}

/// The head dims of `wanted` this build compiles kernels for (all of them,
/// unless LLMKIT_ATTENTION_HEAD_DIMS lists fewer, as the sanitizer build does).
inline std::vector<std::size_t> compiled_head_dims(std::initializer_list<std::size_t> wanted) {
  std::vector<std::size_t> dims;
  for (const std::size_t d : wanted)
    if (attention::supports_head_dim(d)) dims.push_back(d);
  return dims;
}

/// Runs one case on f32, f16, bf16 and int8 caches (`run(T{})` runs it with
/// storage type T) and requires every output finite and within `tolerance`
/// (int8: `int8_tolerance`, by default the same) of the oracle of the stored
/// values, and the 16-bit types' rounding to show against the original
/// values (f32 < f16 < bf16).
template <class Run>
void require_every_storage_type(Run&& run, double tolerance, double int8_tolerance = 0.0) {
  const attention_errors e[] = {run(float{}), run(f16{}), run(bf16{}), run(std::int8_t{})};
  for (const auto& x : e) {
    REQUIRE(x.finite);
    REQUIRE(x.stored < (&x == &e[3] && int8_tolerance > 0.0 ? int8_tolerance : tolerance));
  }
  REQUIRE(e[1].original > e[0].original);
  REQUIRE(e[2].original > e[1].original);
}

}  // namespace llmkit::test
