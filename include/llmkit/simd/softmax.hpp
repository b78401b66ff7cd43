// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/softmax.hpp  In-place softmax and log-softmax of one row.
///
/// Both subtract the row maximum before exponentiating, so no finite input
/// overflows. With temperature T the row is x / T. A row whose entries are all
/// -inf (fully masked) gives all zeros from softmax and all -inf from
/// log_softmax, never NaN. A NaN in the row makes the whole row NaN.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include <xsimd/xsimd.hpp>

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/axpy.hpp"
#include "llmkit/simd/exp.hpp"
#include "llmkit/simd/reduce.hpp"

namespace llmkit::simd {

namespace detail {
inline void check_temperature(const char* fn, float temperature) {
  LLMKIT_CHECK(temperature > 0.0f && std::isfinite(temperature), fn,
               ": temperature must be finite and > 0, got ", temperature);
}

/// out[i] = e^((x[i] - m) * inv_t); returns sum_i out[i]. `store` = false
/// only sums. Templated on Arch like every per-arch helper.
template <class Arch, bool Store>
inline float exp_shifted(const float* x, float* out, std::size_t n, float m, float inv_t) noexcept {
  if constexpr (is_scalar_v<Arch>) {
    float s = 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
      const float e = exp_scalar<Arch>((x[i] - m) * inv_t);
      if constexpr (Store) out[i] = e;
      s += e;
    }
    return s;
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    const batch vm(m), vt(inv_t);
    batch s0(0.0f), s1(0.0f);
    std::size_t i = 0;
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      const batch e0 = exp_batch<Arch>((batch::load_unaligned(x + i) - vm) * vt);
      const batch e1 = exp_batch<Arch>((batch::load_unaligned(x + i + lanes) - vm) * vt);
      if constexpr (Store) {
        e0.store_unaligned(out + i);
        e1.store_unaligned(out + i + lanes);
      }
      s0 += e0;
      s1 += e1;
    }
    for (; i + lanes <= n; i += lanes) {
      const batch e = exp_batch<Arch>((batch::load_unaligned(x + i) - vm) * vt);
      if constexpr (Store) e.store_unaligned(out + i);
      s0 += e;
    }
    float s = xsimd::hadd(s0 + s1);
    if (i < n) {
      alignas(64) float tail[lanes] = {};
      for (std::size_t j = 0; j < n - i; ++j) tail[j] = x[i + j];
      const batch e = exp_batch<Arch>((batch::load_aligned(tail) - vm) * vt);
      e.store_aligned(tail);
      for (std::size_t j = 0; j < n - i; ++j) {
        if constexpr (Store) out[i + j] = tail[j];
        s += tail[j];
      }
    }
    return s;
  }
}
}  // namespace detail

/// x <- softmax(x / temperature), in place: e^((x_i - max) / T) / sum_j e^((x_j - max) / T).
/// An all -inf row (or one whose max is -inf) becomes all zeros.
/// @pre temperature finite and > 0  ([n] x; n == 0 is a no-op)
template <class Arch = default_arch>
void softmax(std::span<float> x, float temperature = 1.0f) {
  detail::check_temperature("softmax", temperature);
  if (x.empty()) return;
  const float m = max<Arch>(std::span<const float>(x));
  if (m == -std::numeric_limits<float>::infinity()) {
    for (float& v : x) v = 0.0f;
    return;
  }
  const float s = detail::exp_shifted<Arch, true>(x.data(), x.data(), x.size(), m, 1.0f / temperature);
  scale<Arch>(x, 1.0f / s);
}

/// x <- log_softmax(x / temperature), in place: (x_i - max) / T - log sum_j e^((x_j - max) / T).
/// An all -inf row stays all -inf.
/// @pre temperature finite and > 0  ([n] x; n == 0 is a no-op)
template <class Arch = default_arch>
void log_softmax(std::span<float> x, float temperature = 1.0f) {
  detail::check_temperature("log_softmax", temperature);
  if (x.empty()) return;
  const float m = max<Arch>(std::span<const float>(x));
  if (m == -std::numeric_limits<float>::infinity()) return;
  const float inv_t = 1.0f / temperature;
  const float s = detail::exp_shifted<Arch, false>(x.data(), nullptr, x.size(), m, inv_t);
  const float log_s = std::log(s);
  const std::size_t n = x.size();
  float* p = x.data();
  if constexpr (is_scalar_v<Arch>) {
    for (std::size_t i = 0; i < n; ++i) p[i] = (p[i] - m) * inv_t - log_s;
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    const batch vm(m), vt(inv_t), vl(log_s);
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) ((batch::load_unaligned(p + i) - vm) * vt - vl).store_unaligned(p + i);
    for (; i < n; ++i) p[i] = (p[i] - m) * inv_t - log_s;
  }
}

}  // namespace llmkit::simd
