// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/detail/kernels.hpp
/// Vector kernels of the sampling module. The exponential and the sums are
/// *canonical*: every arch (scalar, AVX2+FMA, AVX-512) performs the same IEEE
/// operations in the same order, so a seeded draw picks the same token on
/// every machine:
/// - `exp_canonical(x)` for x <= 0: Cody-Waite reduction and the Cephes expf
///   polynomial, every step an explicit fma or a plain add/sub, scaling by 2^n
///   through integer exponent arithmetic (no multiply that -ffp-contract
///   could fuse); exp(x) = 0 for x < -86.5;
/// - sums run over 16 interleaved lanes (element j of a 256-element block goes
///   to lane j % 16) reduced by a fixed pairwise tree, whatever the width of
///   the machine's registers.
/// Archs without FMA (plain SSE) would differ in the last bit.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/sampling/detail/inverse_cdf.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::sampling::detail {

inline constexpr float exp_cutoff = -86.5f;
inline constexpr std::size_t sum_lanes = 16;
inline constexpr std::size_t sum_block = 256;

/// Cephes expf constants.
inline constexpr float exp_log2e = 1.44269504088896341f;
inline constexpr float exp_c1 = 0.693359375f;
inline constexpr float exp_c2 = -2.12194440e-4f;
inline constexpr float exp_p0 = 1.9875691500e-4f, exp_p1 = 1.3981999507e-3f, exp_p2 = 8.3334519073e-3f,
                       exp_p3 = 4.1665795894e-2f, exp_p4 = 1.6666665459e-1f, exp_p5 = 5.0000001201e-1f;

/// exp(x) for x <= 0 (x may be -inf), bit-identical to the vector version.
inline float exp_canonical(float x) noexcept {
  if (!(x >= exp_cutoff)) return 0.0f;
  const float n = std::nearbyint(x * exp_log2e);
  float r = std::fma(n, -exp_c1, x);
  r = std::fma(n, -exp_c2, r);
  float p = exp_p0;
  p = std::fma(p, r, exp_p1);
  p = std::fma(p, r, exp_p2);
  p = std::fma(p, r, exp_p3);
  p = std::fma(p, r, exp_p4);
  p = std::fma(p, r, exp_p5);
  const float z = r * r;
  const float y = std::fma(p, z, r) + 1.0f;
  const std::int32_t bits = std::bit_cast<std::int32_t>(y) + (static_cast<std::int32_t>(n) << 23);
  return std::bit_cast<float>(bits);
}

/// A fused multiply-add with one rounding on every arch, one overload per
/// instruction set (`fused_fma<Arch>(x, y, z, Arch{})`).
template <class Arch>
inline xsimd::batch<float, Arch> fused_fma(const xsimd::batch<float, Arch>& x, const xsimd::batch<float, Arch>& y,
                                           const xsimd::batch<float, Arch>& z,
                                           simd::requires_arch<xsimd::generic>) noexcept {
  return xsimd::fma(x, y, z);
}

#if defined(__AVX512F__)
/// xsimd 8.1 has no AVX-512 overload of fma: its generic x * y + z is fused
/// or not depending on the optimiser, which would break bit-identity with std::fma.
template <class Arch>
inline xsimd::batch<float, Arch> fused_fma(const xsimd::batch<float, Arch>& x, const xsimd::batch<float, Arch>& y,
                                           const xsimd::batch<float, Arch>& z,
                                           simd::requires_arch<xsimd::avx512f>) noexcept {
  return xsimd::batch<float, Arch>(_mm512_fmadd_ps(x, y, z));
}
#endif

/// Vector version of `exp_canonical`.
template <class Arch>
inline xsimd::batch<float, Arch> exp_canonical(const xsimd::batch<float, Arch>& x) noexcept {
  using fb = xsimd::batch<float, Arch>;
  using ib = xsimd::batch<std::int32_t, Arch>;
  const auto valid = x >= fb(exp_cutoff);
  const fb xc = xsimd::select(valid, x, fb(0.0f));
  const fb n = xsimd::nearbyint(xc * fb(exp_log2e));
  fb r = fused_fma<Arch>(n, fb(-exp_c1), xc, Arch{});
  r = fused_fma<Arch>(n, fb(-exp_c2), r, Arch{});
  fb p(exp_p0);
  p = fused_fma<Arch>(p, r, fb(exp_p1), Arch{});
  p = fused_fma<Arch>(p, r, fb(exp_p2), Arch{});
  p = fused_fma<Arch>(p, r, fb(exp_p3), Arch{});
  p = fused_fma<Arch>(p, r, fb(exp_p4), Arch{});
  p = fused_fma<Arch>(p, r, fb(exp_p5), Arch{});
  const fb z = r * r;
  const fb y = fused_fma<Arch>(p, z, r, Arch{}) + fb(1.0f);
  const ib bits = xsimd::bitwise_cast<ib>(y) + (xsimd::to_int(n) << 23);
  return xsimd::select(valid, xsimd::bitwise_cast<fb>(bits), fb(0.0f));
}

/// Maximum of `[n] v`, -inf when empty, over two register accumulators;
/// with `Sanitize` (T = float) each NaN entry is first replaced by -inf in
/// place, otherwise the values hold no NaN.
template <class Arch, bool Sanitize, class T>
float two_register_max(T* v, std::size_t n) noexcept {
  float m = -std::numeric_limits<float>::infinity();
  std::size_t i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using fb = xsimd::batch<float, Arch>;
    constexpr std::size_t L = fb::size;
    fb acc0(m), acc1(m);
    for (; i + 2 * L <= n; i += 2 * L) {
      fb a = fb::load_unaligned(v + i), b = fb::load_unaligned(v + i + L);
      if constexpr (Sanitize) {
        const auto na = xsimd::isnan(a), nb = xsimd::isnan(b);
        if (xsimd::any(na | nb)) [[unlikely]] {
          a = xsimd::select(na, fb(-std::numeric_limits<float>::infinity()), a);
          b = xsimd::select(nb, fb(-std::numeric_limits<float>::infinity()), b);
          a.store_unaligned(v + i);
          b.store_unaligned(v + i + L);
        }
      }
      acc0 = xsimd::max(acc0, a);
      acc1 = xsimd::max(acc1, b);
    }
    alignas(64) float lanes[L];
    xsimd::max(acc0, acc1).store_aligned(lanes);
    for (std::size_t l = 0; l < L; ++l) m = std::max(m, lanes[l]);
  }
  for (; i < n; ++i) {
    if constexpr (Sanitize)
      if (v[i] != v[i]) v[i] = -std::numeric_limits<float>::infinity();
    m = std::max(m, v[i]);
  }
  return m;
}

/// Replaces NaN by -inf in place and returns the maximum ([n] values).
/// @throws llmkit::error if an entry is +inf.
template <class Arch = simd::default_arch>
float sanitize_max(std::span<float> values) {
  const float m = two_register_max<Arch, true>(values.data(), values.size());
  if (m == std::numeric_limits<float>::infinity()) [[unlikely]] {
    for (std::size_t j = 0; j < values.size(); ++j)
      LLMKIT_CHECK(values[j] != std::numeric_limits<float>::infinity(), "logits: entry ", j, " is +inf");
  }
  return m;
}

/// Maximum of [n] values (no NaN); -inf when empty.
template <class Arch = simd::default_arch>
float max_value(std::span<const float> values) noexcept {
  return two_register_max<Arch, false>(values.data(), values.size());
}

/// Canonical block sums of exp(values - m): `[ceil(n / 256)] block_sums`;
/// optionally stores `[n] exps` (may be empty). Returns the total (the
/// block sums added in order, in double).
template <class Arch = simd::default_arch>
double exp_block_sums(std::span<const float> values, float m, std::span<double> block_sums, std::span<float> exps = {}) {
  const std::size_t n = values.size();
  const float* v = values.data();
  const bool store = !exps.empty();
  double total = 0.0;
  std::size_t b = 0;
  for (std::size_t start = 0; start < n; start += sum_block, ++b) {
    const std::size_t end = std::min(n, start + sum_block);
    alignas(64) float lane[sum_lanes] = {};
    std::size_t i = start;
    if constexpr (!simd::is_scalar_v<Arch>) {
      using fb = xsimd::batch<float, Arch>;
      constexpr std::size_t L = fb::size;
      static_assert(sum_lanes % L == 0, "exp_block_sums: register width must divide 16 floats");
      constexpr std::size_t A = sum_lanes / L;
      fb acc[A];
      for (auto& a : acc) a = fb(0.0f);
      const fb mb(m);
      for (; i + sum_lanes <= end; i += sum_lanes) {
        for (std::size_t a = 0; a < A; ++a) {
          const fb e = exp_canonical<Arch>(fb::load_unaligned(v + i + a * L) - mb);
          if (store) e.store_unaligned(exps.data() + i + a * L);
          acc[a] = acc[a] + e;
        }
      }
      for (std::size_t a = 0; a < A; ++a) acc[a].store_aligned(lane + a * L);
    } else {
      for (; i + sum_lanes <= end; i += sum_lanes) {
        for (std::size_t l = 0; l < sum_lanes; ++l) {
          const float e = exp_canonical(v[i + l] - m);
          if (store) exps[i + l] = e;
          lane[l] = lane[l] + e;
        }
      }
    }
    for (std::size_t l = 0; i < end; ++i, ++l) {
      const float e = exp_canonical(v[i] - m);
      if (store) exps[i] = e;
      lane[l] = lane[l] + e;
    }
    for (std::size_t w = sum_lanes / 2; w > 0; w /= 2)
      for (std::size_t l = 0; l < w; ++l) lane[l] = lane[l] + lane[l + w];
    block_sums[b] = lane[0];
    total += lane[0];
  }
  return total;
}

/// Number of blocks `exp_block_sums` writes for n values.
constexpr std::size_t n_sum_blocks(std::size_t n) noexcept { return (n + sum_block - 1) / sum_block; }

/// Index of the element at which the running sum of exp(values - m), in
/// order, first exceeds `target` (0 <= target < total), using the block sums
/// of `exp_block_sums`. Deterministic: scalar within the block, in order.
inline std::size_t inverse_cdf(std::span<const float> values, float m, std::span<const double> block_sums,
                               double target) noexcept {
  const std::size_t n = values.size();
  std::size_t b = 0;
  double cum = 0.0;
  const std::size_t nb = n_sum_blocks(n);
  for (; b + 1 < nb; ++b) {
    if (cum + block_sums[b] > target) break;
    cum += block_sums[b];
  }
  // Last block with any mass, should rounding push the target past the end.
  while (b > 0 && block_sums[b] == 0.0) --b;
  const std::size_t start = b * sum_block, end = std::min(n, start + sum_block);
  return inverse_cdf_scan(start, end, cum, target, [&](std::size_t i) { return exp_canonical(values[i] - m); });
}

/// Order-preserving map of a float to uint32 *descending* in the value:
/// larger values give smaller keys; -inf gives the largest finite key.
inline std::uint32_t descending_key(float v) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t ordinal = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending in v
  return ~ordinal;
}

/// The float whose descending_key is `key` (inverse of descending_key).
inline float value_of_descending_key(std::uint32_t key) noexcept {
  const std::uint32_t ordinal = ~key;
  const std::uint32_t u = (ordinal & 0x80000000u) ? (ordinal & 0x7fffffffu) : ~ordinal;
  return std::bit_cast<float>(u);
}

}  // namespace llmkit::sampling::detail

LLMKIT_SIMD_DIAGNOSTICS_END
