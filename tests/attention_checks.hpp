// SPDX-License-Identifier: MIT
#pragma once

// Checks shared by the prefill and decode tests (Catch2).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>
#include <xsimd/xsimd.hpp>

#include <llmkit/attention/head_dims.hpp>
#include <llmkit/attention/mask.hpp>
#include <llmkit/core/dtype.hpp>
#include <llmkit/simd/arch.hpp>

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

/// `[n_heads]` attention-sink logits around `mean` (mean + k / 2 for a
/// random k in [-4, 4] per head), or none when `mean` is NaN.
inline std::vector<float> random_sinks(std::size_t n_heads, float mean, std::mt19937& rng) {
  std::vector<float> sinks;
  if (!std::isnan(mean))
    for (std::size_t h = 0; h < n_heads; ++h) sinks.push_back(mean + float(int(rng() % 9) - 4) * 0.5f);
  return sinks;
}

/// Runs one case with sinks on f32, f16, bf16 and int8 caches, on the
/// scalar arch, and under a sliding window of `window` keys
/// (`run(T{}, Arch{}, mask)` runs it with storage type T on Arch), and
/// requires every output finite and within `tolerance` (int8:
/// `int8_tolerance`) of the oracle of the stored values. Returns the f32
/// run's errors.
template <class Run>
attention_errors require_sinks_everywhere(Run&& run, attention::position window, double tolerance,
                                          double int8_tolerance) {
  using simd::default_arch;
  const attention::causal_mask causal;
  const attention_errors e[] = {run(float{}, default_arch{}, causal),
                                run(f16{}, default_arch{}, causal),
                                run(bf16{}, default_arch{}, causal),
                                run(std::int8_t{}, default_arch{}, causal),
                                run(float{}, simd::scalar{}, causal),
                                run(float{}, default_arch{}, attention::sliding_window_mask(window))};
  for (const auto& x : e) {
    REQUIRE(x.finite);
    REQUIRE(x.stored < (&x == &e[3] ? int8_tolerance : tolerance));
  }
  return e[0];
}

}  // namespace llmkit::test
