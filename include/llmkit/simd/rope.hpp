// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/rope.hpp  Rotary position embedding (RoPE) of one token's heads.
///
/// The first `rotary_dim` dimensions of each head are split into pairs that
/// are rotated by the angle position * freq_scale * theta^(-2i / rotary_dim)
/// / freq_factors[i] for pair i (the factors default to 1; Llama 3.1 stores
/// them as `rope_freqs.weight`); the remaining dimensions are left alone.
/// Two pair layouts:
/// - `rope_layout::interleaved`: pairs (2i, 2i + 1), as Llama/GGUF (llama.cpp's
///   "normal" RoPE);
/// - `rope_layout::half_split`: pairs (i, i + rotary_dim / 2), as GPT-NeoX.
///
/// YaRN context extension (`rope_config::yarn`, llama.cpp's rope_yarn) blends,
/// per pair, the interpolated angle (times freq_scale) with the extrapolated
/// one (unscaled): pairs below the correction range [lo, hi] keep the
/// extrapolated angle (high frequencies), pairs above it the interpolated one,
/// with a linear ramp between; cos and sin are then scaled by
/// 1 + 0.1 ln(1 / freq_scale).
///
/// Angles are computed in double precision and rounded to f32 cos/sin, the
/// same way in `rope_table` (precomputed) and in the on-the-fly overload, so
/// both give bit-identical results.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/batch_ops.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

/// Which dimensions of a head form a rotated pair.
enum class rope_layout {
  interleaved, ///< pairs (2i, 2i + 1): Llama / GGUF
  half_split,  ///< pairs (i, i + rotary_dim / 2): GPT-NeoX
};

/// YaRN ("NTK-by-parts" interpolation, Peng et al. 2023) as GGUF files give
/// it (`rope.scaling.type` "yarn"; gpt-oss, Qwen3's long context). Off while
/// ext_factor is 0. The correction range of pair indices is
/// [max(0, floor(c(beta_fast))), min(rotary_dim - 1, ceil(c(beta_slow)))]
/// with c(beta) = rotary_dim * ln(original_context / (2 pi beta)) / (2 ln theta).
struct yarn_scaling {
  float ext_factor = 0.0f;            ///< weight of the extrapolated angle at the ramp's full end, in [0, 1]; 0: off
  float beta_fast = 32.0f;            ///< rotations over the original context where the ramp starts (> 0)
  float beta_slow = 1.0f;             ///< rotations where it ends (> 0)
  std::size_t original_context = 0;   ///< the training context before extension (> 0 when on)
};

/// RoPE parameters of a model.
struct rope_config {
  float theta = 10000.0f;                        ///< base of the frequencies (> 0)
  rope_layout layout = rope_layout::interleaved; ///< pair layout
  std::size_t rotary_dim = 0;                    ///< rotated dimensions per head (even); 0 = the whole head
  float freq_scale = 1.0f;                       ///< linear position scaling (position * freq_scale)
  /// [rotary_dim / 2] per-pair divisors of the frequency (finite, > 0), or
  /// empty for none (llama.cpp's `freq_factors`, in either layout).
  std::vector<float> freq_factors{};
  /// YaRN; with it, freq_scale is 1 / the extension factor.
  yarn_scaling yarn{};
};

namespace detail {

/// Validates config against head_dim and returns the effective rotary_dim.
inline std::size_t rope_rotary_dim(const rope_config& config, std::size_t head_dim) {
  LLMKIT_CHECK(head_dim > 0, "rope: head_dim must be > 0, got ", head_dim);
  const std::size_t rotary_dim = config.rotary_dim == 0 ? head_dim : config.rotary_dim;
  LLMKIT_CHECK(rotary_dim <= head_dim, "rope: rotary_dim = ", rotary_dim, " exceeds head_dim = ", head_dim);
  LLMKIT_CHECK(rotary_dim % 2 == 0, "rope: rotary_dim must be even, got ", rotary_dim);
  LLMKIT_CHECK(config.theta > 0.0f && std::isfinite(config.theta), "rope: theta must be finite and > 0, got ",
               config.theta);
  LLMKIT_CHECK(std::isfinite(config.freq_scale), "rope: freq_scale must be finite, got ", config.freq_scale);
  LLMKIT_CHECK(config.freq_factors.empty() || config.freq_factors.size() == rotary_dim / 2,
               "rope: freq_factors.size() = ", config.freq_factors.size(), " differs from rotary_dim / 2 = ",
               rotary_dim / 2);
  for (std::size_t i = 0; i < config.freq_factors.size(); ++i)
    LLMKIT_CHECK(config.freq_factors[i] > 0.0f && std::isfinite(config.freq_factors[i]), "rope: freq_factors[", i,
                 "] = ", config.freq_factors[i], " must be finite and > 0");
  const yarn_scaling& y = config.yarn;
  LLMKIT_CHECK(y.ext_factor >= 0.0f && y.ext_factor <= 1.0f, "rope: yarn.ext_factor = ", y.ext_factor,
               " must be in [0, 1]");
  if (y.ext_factor != 0.0f) {
    LLMKIT_CHECK(y.beta_fast > 0.0f && y.beta_slow > 0.0f && std::isfinite(y.beta_fast) && std::isfinite(y.beta_slow),
                 "rope: yarn.beta_fast = ", y.beta_fast, " and yarn.beta_slow = ", y.beta_slow,
                 " must be finite and > 0");
    LLMKIT_CHECK(y.original_context > 0, "rope: yarn.original_context must be > 0 when YaRN is on");
    LLMKIT_CHECK(config.freq_scale > 0.0f, "rope: YaRN needs freq_scale > 0, got ", config.freq_scale);
  }
  return rotary_dim;
}

/// YaRN's correction range [lo, hi] of pair indices (see yarn_scaling).
inline void yarn_correction_range(const rope_config& config, std::size_t rotary_dim, double& lo, double& hi) {
  auto c = [&](double beta) {
    return double(rotary_dim) * std::log(double(config.yarn.original_context) / (2.0 * 3.141592653589793 * beta)) /
           (2.0 * std::log(double(config.theta)));
  };
  lo = std::max(0.0, std::floor(c(config.yarn.beta_fast)));
  hi = std::min(double(rotary_dim) - 1.0, std::ceil(c(config.yarn.beta_slow)));
}

/// Per-dimension factors for one position: out[j] = x[j] * cos_e[j] + x[partner(j)] * sin_e[j]
/// with the sign of the sine folded into sin_e. ([rotary_dim] cos_e, [rotary_dim] sin_e)
inline void rope_factors(const rope_config& config, std::size_t rotary_dim, std::int32_t position, float* cos_e,
                         float* sin_e) {
  const std::size_t half = rotary_dim / 2;
  const bool yarn = config.yarn.ext_factor != 0.0f;
  double lo = 0.0, hi = 0.0, magnitude = 1.0;
  if (yarn) {
    yarn_correction_range(config, rotary_dim, lo, hi);
    magnitude = 1.0 + 0.1 * std::log(1.0 / static_cast<double>(config.freq_scale));
  }
  for (std::size_t i = 0; i < half; ++i) {
    double inv_freq = std::pow(static_cast<double>(config.theta),
                               -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
    if (!config.freq_factors.empty()) inv_freq /= static_cast<double>(config.freq_factors[i]);
    double angle = static_cast<double>(position) * static_cast<double>(config.freq_scale) * inv_freq;
    if (yarn) {
      const double extrapolated = static_cast<double>(position) * inv_freq;
      const double ramp = 1.0 - std::clamp((double(i) - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
      const double mix = ramp * static_cast<double>(config.yarn.ext_factor);
      angle = angle * (1.0 - mix) + extrapolated * mix;
    }
    const float c = static_cast<float>(std::cos(angle) * magnitude);
    const float s = static_cast<float>(std::sin(angle) * magnitude);
    const std::size_t first = config.layout == rope_layout::interleaved ? 2 * i : i;
    const std::size_t second = config.layout == rope_layout::interleaved ? 2 * i + 1 : i + half;
    cos_e[first] = c;
    cos_e[second] = c;
    sin_e[first] = -s;
    sin_e[second] = s;
  }
}

/// Rotates every head of one token with per-dimension factors.
/// ([n_heads * head_dim] x, [rotary_dim] cos_e, [rotary_dim] sin_e)
template <class Arch>
inline void rope_rotate(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t rotary_dim,
                        rope_layout layout, const float* cos_e, const float* sin_e) noexcept {
  const std::size_t half = rotary_dim / 2;
  for (std::size_t h = 0; h < n_heads; ++h) {
    float* head = x + h * head_dim;
    std::size_t done = 0;  // pairs rotated by the vector loop
    if constexpr (!is_scalar_v<Arch>) {
      using batch = xsimd::batch<float, Arch>;
      constexpr std::size_t lanes = batch::size;
      if (layout == rope_layout::interleaved) {
        using ubatch = xsimd::batch<std::uint32_t, Arch>;
        constexpr auto swap = xsimd::make_batch_constant<ubatch, swap_pairs_index>();
        std::size_t j = 0;
        for (; j + lanes <= rotary_dim; j += lanes) {
          const batch v = batch::load_unaligned(head + j);
          const batch r = v * batch::load_unaligned(cos_e + j) + xsimd::swizzle(v, swap) * batch::load_unaligned(sin_e + j);
          r.store_unaligned(head + j);
        }
        done = j / 2;
      } else {
        std::size_t i = 0;
        for (; i + lanes <= half; i += lanes) {
          const batch lo = batch::load_unaligned(head + i);
          const batch hi = batch::load_unaligned(head + i + half);
          const batch new_lo = lo * batch::load_unaligned(cos_e + i) + hi * batch::load_unaligned(sin_e + i);
          const batch new_hi =
              hi * batch::load_unaligned(cos_e + i + half) + lo * batch::load_unaligned(sin_e + i + half);
          new_lo.store_unaligned(head + i);
          new_hi.store_unaligned(head + i + half);
        }
        done = i;
      }
    }
    if (layout == rope_layout::interleaved) {
      for (std::size_t p = 2 * done; p < rotary_dim; p += 2) {
        const float a = head[p], b = head[p + 1];
        head[p] = a * cos_e[p] + b * sin_e[p];
        head[p + 1] = b * cos_e[p + 1] + a * sin_e[p + 1];
      }
    } else {
      for (std::size_t p = done; p < half; ++p) {
        const float a = head[p], b = head[p + half];
        head[p] = a * cos_e[p] + b * sin_e[p];
        head[p + half] = b * cos_e[p + half] + a * sin_e[p + half];
      }
    }
  }
}

inline void rope_check_x(std::size_t x_size, std::size_t head_dim, std::int32_t position) {
  LLMKIT_CHECK(x_size % head_dim == 0, "apply_rope: x.size() = ", x_size, " is not a multiple of head_dim = ",
               head_dim);
  LLMKIT_CHECK(position >= 0, "apply_rope: position must be >= 0, got ", position);
}

}  // namespace detail

/// cos/sin factors of every position below `max_positions`, precomputed once
/// per model (max_positions * rotary_dim * 2 floats).
class rope_table {
 public:
  /// @pre config valid for head_dim (see rope_config); max_positions > 0
  rope_table(const rope_config& config, std::size_t head_dim, std::size_t max_positions)
      : config_(config),
        head_dim_(head_dim),
        rotary_dim_(detail::rope_rotary_dim(config, head_dim)),
        max_positions_(max_positions) {
    LLMKIT_CHECK(max_positions > 0, "rope_table: max_positions must be > 0, got ", max_positions);
    cos_.resize(max_positions_ * rotary_dim_);
    sin_.resize(max_positions_ * rotary_dim_);
    for (std::size_t p = 0; p < max_positions_; ++p)
      detail::rope_factors(config_, rotary_dim_, static_cast<std::int32_t>(p), cos_.data() + p * rotary_dim_,
                           sin_.data() + p * rotary_dim_);
  }

  const rope_config& config() const noexcept { return config_; }
  std::size_t head_dim() const noexcept { return head_dim_; }
  std::size_t rotary_dim() const noexcept { return rotary_dim_; }
  std::size_t max_positions() const noexcept { return max_positions_; }

  /// Per-dimension cosine factors of `position`: [rotary_dim], cos of pair i
  /// at both dimensions of the pair. @pre 0 <= position < max_positions
  std::span<const float> cos_row(std::int32_t position) const {
    check_position(position);
    return {cos_.data() + static_cast<std::size_t>(position) * rotary_dim_, rotary_dim_};
  }
  /// Per-dimension sine factors of `position`: [rotary_dim], -sin at the first
  /// dimension of each pair and +sin at the second, so that
  /// out[j] = x[j] * cos_row[j] + x[partner(j)] * sin_row[j].
  std::span<const float> sin_row(std::int32_t position) const {
    check_position(position);
    return {sin_.data() + static_cast<std::size_t>(position) * rotary_dim_, rotary_dim_};
  }

 private:
  void check_position(std::int32_t position) const {
    LLMKIT_CHECK(position >= 0 && static_cast<std::size_t>(position) < max_positions_, "rope_table: position = ",
                 position, " outside [0, max_positions = ", max_positions_, ")");
  }

  rope_config config_;
  std::size_t head_dim_;
  std::size_t rotary_dim_;
  std::size_t max_positions_;
  aligned_vector<float> cos_;
  aligned_vector<float> sin_;
};

/// Rotates the heads of one token in place, computing the angles on the fly.
/// @pre x.size() a multiple of head_dim; position >= 0; config valid for head_dim
/// ([n_heads, head_dim] x)
template <class Arch = default_arch>
void apply_rope(std::span<float> x, std::size_t head_dim, std::int32_t position, const rope_config& config) {
  const std::size_t rotary_dim = detail::rope_rotary_dim(config, head_dim);
  detail::rope_check_x(x.size(), head_dim, position);
  constexpr std::size_t stack_dims = 512;
  alignas(64) float cos_stack[stack_dims], sin_stack[stack_dims];
  std::vector<float> heap;
  float* cos_e = cos_stack;
  float* sin_e = sin_stack;
  if (rotary_dim > stack_dims) {
    heap.resize(2 * rotary_dim);
    cos_e = heap.data();
    sin_e = heap.data() + rotary_dim;
  }
  detail::rope_factors(config, rotary_dim, position, cos_e, sin_e);
  detail::rope_rotate<Arch>(x.data(), x.size() / head_dim, head_dim, rotary_dim, config.layout, cos_e, sin_e);
}

/// Rotates the heads of one token in place with precomputed angles.
/// @pre head_dim == table.head_dim(); x.size() a multiple of head_dim;
/// 0 <= position < table.max_positions()  ([n_heads, head_dim] x)
template <class Arch = default_arch>
void apply_rope(std::span<float> x, std::size_t head_dim, std::int32_t position, const rope_table& table) {
  LLMKIT_CHECK(head_dim == table.head_dim(), "apply_rope: head_dim = ", head_dim,
               " differs from the table's head_dim = ", table.head_dim());
  detail::rope_check_x(x.size(), head_dim, position);
  detail::rope_rotate<Arch>(x.data(), x.size() / head_dim, head_dim, table.rotary_dim(), table.config().layout,
                            table.cos_row(position).data(), table.sin_row(position).data());
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
