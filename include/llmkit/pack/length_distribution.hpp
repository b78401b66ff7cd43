// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/length_distribution.hpp
/// Synthetic prompt-length workloads for measuring batching methods:
/// uniform[min, max], a long-tailed lognormal shaped like chat prompts (given
/// by its median and 99th percentile, capped at the model's context),
/// constant lengths (the control, where packing has nothing to remove), and a
/// mixed set: mostly short prompts with a few at the context length (short
/// chat turns beside a few long documents), where one long prompt pads a
/// whole batch of short ones.
/// Reproducible for a given seed with the same standard library.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::pack {

/// The shape of a prompt-length workload.
enum class length_shape { uniform, lognormal, constant, mixed };

/// A prompt-length distribution; the fields a shape does not use are ignored.
struct length_distribution {
  length_shape shape = length_shape::uniform;
  std::size_t min_length = 8;    ///< uniform, mixed: smallest length; all shapes: floor
  std::size_t max_length = 512;  ///< uniform: largest length; mixed: the long prompts' length; all shapes: cap (the model's context)
  double median = 60.0;          ///< lognormal: median length
  double p99 = 1000.0;           ///< lognormal: 99th percentile before capping
  std::size_t constant = 128;    ///< constant: the length
  double long_fraction = 0.05;   ///< mixed: probability that a prompt is long (max_length tokens)
  std::size_t short_max = 64;    ///< mixed: short prompts are uniform[min_length, short_max]
};

/// Printable name of a shape: "uniform", "lognormal", "constant".
constexpr std::string_view length_shape_name(length_shape s) noexcept {
  switch (s) {
    case length_shape::uniform: return "uniform";
    case length_shape::lognormal: return "lognormal";
    case length_shape::constant: return "constant";
    case length_shape::mixed: return "mixed";
  }
  return "?";
}

/// Draws `n` prompt lengths, each in [max(1, min_length), max_length].
/// @throws llmkit::error for max_length < max(1, min_length), a non-positive
///   median, p99 < median, a constant outside [1, max_length], or (mixed) a
///   long_fraction outside [0, 1] or short_max outside [min_length, max_length].
inline std::vector<std::size_t> sample_lengths(const length_distribution& d, std::size_t n, std::uint64_t seed) {
  const std::size_t lo = std::max<std::size_t>(1, d.min_length);
  LLMKIT_CHECK(d.max_length >= lo, "sample_lengths: max_length ", d.max_length, " is below min_length ", lo);
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> lengths(n);
  switch (d.shape) {
    case length_shape::uniform: {
      std::uniform_int_distribution<std::size_t> u(lo, d.max_length);
      for (auto& l : lengths) l = u(rng);
      break;
    }
    case length_shape::lognormal: {
      LLMKIT_CHECK(d.median > 0, "sample_lengths: lognormal median must be > 0, got ", d.median);
      LLMKIT_CHECK(d.p99 >= d.median, "sample_lengths: lognormal p99 ", d.p99, " is below the median ", d.median);
      const double z99 = 2.3263478740408408;  // standard normal 99th percentile
      std::lognormal_distribution<double> ln(std::log(d.median), std::log(d.p99 / d.median) / z99);
      for (auto& l : lengths) {
        const double x = std::round(ln(rng));
        l = x >= static_cast<double>(d.max_length) ? d.max_length : std::max(lo, static_cast<std::size_t>(x));
      }
      break;
    }
    case length_shape::constant: {
      LLMKIT_CHECK(d.constant >= 1 && d.constant <= d.max_length, "sample_lengths: constant length ", d.constant,
                   " is outside [1, max_length = ", d.max_length, "]");
      std::fill(lengths.begin(), lengths.end(), d.constant);
      break;
    }
    case length_shape::mixed: {
      LLMKIT_CHECK(d.long_fraction >= 0.0 && d.long_fraction <= 1.0, "sample_lengths: mixed long_fraction ",
                   d.long_fraction, " is outside [0, 1]");
      LLMKIT_CHECK(d.short_max >= lo && d.short_max <= d.max_length, "sample_lengths: mixed short_max ", d.short_max,
                   " is outside [min_length = ", lo, ", max_length = ", d.max_length, "]");
      std::bernoulli_distribution is_long(d.long_fraction);
      std::uniform_int_distribution<std::size_t> short_length(lo, d.short_max);
      for (auto& l : lengths) l = is_long(rng) ? d.max_length : short_length(rng);
      break;
    }
  }
  return lengths;
}

}  // namespace llmkit::pack
