// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/softmax.hpp  In-place softmax and log-softmax of one row.
///
/// Both subtract the row maximum before exponentiating, so no finite input
/// overflows. With temperature T the row is x / T. A row whose entries are all
/// -inf (fully masked) gives all zeros from softmax and all -inf from
/// log_softmax, never NaN. A NaN or a +inf in the row makes the whole row NaN.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>
#include <algorithm>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/axpy.hpp"
#include "llmkit/simd/exp.hpp"
#include "llmkit/simd/reduce.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

namespace detail {
/// 1 / temperature, after checking that the temperature is finite and > 0
/// (`fn` names the caller in the message).
inline float inverse_temperature(const char* fn, float temperature) {
  LLMKIT_CHECK(temperature > 0.0f && std::isfinite(temperature), fn,
               ": temperature must be finite and > 0, got ", temperature);
  return 1.0f / temperature;
}

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// Asks for the cache line at `p` to be brought into L2 (a hint; no-op where
/// the compiler has no prefetch builtin).
inline void prefetch_l2([[maybe_unused]] const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 2);
#endif
}

/// out[i] = e^((x[i] - m) * inv_t); returns sum_i out[i]. `store` = false
/// only sums. If `next` is not null, the `n` floats at `next` (the next
/// chunk of a long row) are prefetched meanwhile, so that their read from
/// memory overlaps this chunk's arithmetic. Templated on Arch like every
/// per-arch helper.
template <class Arch, bool Store>
inline float exp_shifted(const float* x, float* out, std::size_t n, float m, float inv_t,
                         const float* next = nullptr) noexcept {
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
    constexpr std::size_t line_floats = 64 / sizeof(float);
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      if (next != nullptr)
        for (std::size_t j = 0; j < 2 * lanes; j += line_floats) prefetch_l2(next + i + j);
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

/// Rows longer than this are processed in L1-sized chunks of this many values
/// (see softmax).
inline constexpr std::size_t softmax_chunk = 8192;

/// x <- softmax(x / temperature), in place: e^((x_i - max) / T) / sum_j e^((x_j - max) / T).
/// An all -inf row (or one whose max is -inf) becomes all zeros.
///
/// Memory traffic: a row of up to `softmax_chunk` values makes three passes
/// (max; exp, store and sum; scale) over cache-resident data. A longer row is
/// cut into chunks of `softmax_chunk` values (32 KiB, L1-resident): each chunk
/// is read from memory once for its max, then exponentiated against that max
/// while in L1; a last pass rescales each chunk by e^(max_c - max) / sum. So a
/// long row is read twice and written twice (16 bytes per value), not 20.
/// Rows longer than 4096 chunks (32 Mi values) allocate a small vector of the
/// chunk maxima.
/// @pre temperature finite and > 0  ([n] x; n == 0 is a no-op)
template <class Arch = default_arch>
void softmax(std::span<float> x, float temperature = 1.0f) {
  const float inv_t = detail::inverse_temperature("softmax", temperature);
  const std::size_t n = x.size();
  if (n == 0) return;
  if (n <= softmax_chunk) {
    const float m = max<Arch>(std::span<const float>(x));
    if (m == detail::neg_inf) {
      for (float& v : x) v = 0.0f;
      return;
    }
    const float s = detail::exp_shifted<Arch, true>(x.data(), x.data(), n, m, inv_t);
    scale<Arch>(x, 1.0f / s);
    return;
  }
  const std::size_t n_chunks = (n + softmax_chunk - 1) / softmax_chunk;
  constexpr std::size_t stack_chunks = 4096;
  float maxima_stack[stack_chunks];
  std::vector<float> maxima_heap;
  float* maxima = maxima_stack;
  if (n_chunks > stack_chunks) {
    maxima_heap.resize(n_chunks);
    maxima = maxima_heap.data();
  }
  // Pass 1 per chunk: its max (memory), then e^((x - max_c) / T) in place (L1).
  // The running total is kept relative to the running max.
  float running_max = detail::neg_inf;
  float total = 0.0f;
  for (std::size_t c = 0; c < n_chunks; ++c) {
    const std::size_t begin = c * softmax_chunk;
    const std::size_t len = std::min(softmax_chunk, n - begin);
    float* p = x.data() + begin;
    const float m = max<Arch>(std::span<const float>(p, len));
    maxima[c] = m;
    if (m == detail::neg_inf) {
      for (std::size_t i = 0; i < len; ++i) p[i] = 0.0f;
      continue;
    }
    const float* next = c + 1 < n_chunks ? p + softmax_chunk : nullptr;
    const std::size_t next_len = next == nullptr ? 0 : std::min(softmax_chunk, n - begin - softmax_chunk);
    const float s = detail::exp_shifted<Arch, true>(p, p, len, m, inv_t, next_len == len ? next : nullptr);
    if (m > running_max) {
      total = total * detail::exp_scalar<Arch>((running_max - m) * inv_t) + s;
      running_max = m;
    } else {
      total += s * detail::exp_scalar<Arch>((m - running_max) * inv_t);
    }
  }
  if (running_max == detail::neg_inf) return;  // all zeros already
  // Pass 2: rescale each chunk to the global max and normalise.
  const float inv_total = 1.0f / total;
  for (std::size_t c = 0; c < n_chunks; ++c) {
    const std::size_t begin = c * softmax_chunk;
    const std::size_t len = std::min(softmax_chunk, n - begin);
    if (maxima[c] == detail::neg_inf) continue;
    scale<Arch>(x.subspan(begin, len), detail::exp_scalar<Arch>((maxima[c] - running_max) * inv_t) * inv_total);
  }
}

/// x <- log_softmax(x / temperature), in place: (x_i - max) / T - log sum_j e^((x_j - max) / T).
/// An all -inf row stays all -inf. A long row is read twice and written once:
/// per L1-sized chunk its max and its sum of exponentials (merged online),
/// then one pass writes the result.
/// @pre temperature finite and > 0  ([n] x; n == 0 is a no-op)
template <class Arch = default_arch>
void log_softmax(std::span<float> x, float temperature = 1.0f) {
  const float inv_t = detail::inverse_temperature("log_softmax", temperature);
  const std::size_t n = x.size();
  if (n == 0) return;
  float m = detail::neg_inf;
  float s = 0.0f;
  for (std::size_t begin = 0; begin < n; begin += softmax_chunk) {
    const std::size_t len = std::min(softmax_chunk, n - begin);
    const float* p = x.data() + begin;
    const float mc = max<Arch>(std::span<const float>(p, len));
    if (mc == detail::neg_inf) continue;
    const bool full_next = begin + 2 * softmax_chunk <= n;
    const float sc = detail::exp_shifted<Arch, false>(p, nullptr, len, mc, inv_t, full_next ? p + len : nullptr);
    if (mc > m) {
      s = s * detail::exp_scalar<Arch>((m - mc) * inv_t) + sc;
      m = mc;
    } else {
      s += sc * detail::exp_scalar<Arch>((mc - m) * inv_t);
    }
  }
  if (m == detail::neg_inf) return;
  const float log_s = std::log(s);
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

LLMKIT_SIMD_DIAGNOSTICS_END
