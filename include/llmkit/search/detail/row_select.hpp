// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/detail/row_select.hpp
/// The two passes beam search makes over a logits row instead of a full
/// double-precision log-softmax and a sort of the vocabulary:
/// - `log_sum_exp`: log sum_i e^(x_i) (NaN entries count as -inf), with
///   vectorised f32 exponentials summed per 256-value chunk and the chunks
///   in double, so log_softmax(x)_i = x_i - log_sum_exp(x) to ~1e-7;
/// - `top_entries`: the m best entries (value descending, index ascending),
///   one pass that compares a whole register with the current m-th best and
///   touches a small heap only for the rare entries that beat it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"
#include "llmkit/simd/exp.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::search::detail {

/// One selected entry of a row.
struct row_entry {
  float value;         ///< the logit
  token_id index;  ///< its token id
};

/// Best first: value descending, then index ascending.
inline bool better_entry(const row_entry& a, const row_entry& b) noexcept {
  return a.value != b.value ? a.value > b.value : a.index < b.index;
}

/// log sum_i e^(logits_i) of `[n] logits`; NaN entries count as -inf.
/// @throws llmkit::error (prefixed by `who`) when an entry is +inf or every
/// entry is -inf or NaN.
template <class Arch = simd::default_arch>
double log_sum_exp(std::span<const float> logits, const char* who) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const float* x = logits.data();
  const std::size_t n = logits.size();
  float m = ninf;
  bool pos_inf = false;
  std::size_t i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    batch mv(ninf);
    xsimd::batch_bool<float, Arch> inf_seen(false);
    for (; i + lanes <= n; i += lanes) {
      const batch v = batch::load_unaligned(x + i);
      inf_seen = inf_seen || (v == batch(std::numeric_limits<float>::infinity()));
      mv = xsimd::max(mv, xsimd::select(v == v, v, batch(ninf)));  // NaN never wins
    }
    pos_inf = xsimd::any(inf_seen);
    alignas(64) float lane_max[lanes];
    mv.store_aligned(lane_max);
    for (float v : lane_max) m = std::max(m, v);
  }
  for (; i < n; ++i) {
    pos_inf = pos_inf || x[i] == std::numeric_limits<float>::infinity();
    if (x[i] == x[i]) m = std::max(m, x[i]);
  }
  LLMKIT_CHECK(!pos_inf, who, ": a logit is +inf");
  LLMKIT_CHECK(m != ninf, who, ": every logit is -inf or NaN (vocab ", n, ")");

  double sum = 0.0;
  i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    constexpr std::size_t chunk = 256;  // values summed in f32 before the double accumulator
    const batch mb(m);
    while (i + lanes <= n) {
      batch acc(0.0f);
      const std::size_t end = std::min(n - (n - i) % lanes, i + chunk);
      for (; i < end; i += lanes) {
        const batch v = batch::load_unaligned(x + i);
        // NaN - m is NaN: map it to -inf first, whose e^ is exactly 0.
        acc += simd::detail::exp_batch<Arch>(xsimd::select(v == v, v - mb, batch(ninf)));
      }
      sum += static_cast<double>(xsimd::hadd(acc));
    }
  }
  for (; i < n; ++i)
    if (x[i] == x[i]) sum += std::exp(static_cast<double>(x[i]) - static_cast<double>(m));
  return static_cast<double>(m) + std::log(sum);
}

/// Replaces `out` by the `m` best entries of `[n] logits` greater than -inf
/// (value descending, then index ascending; NaN entries never chosen), best
/// first; fewer when the row has fewer such entries.
template <class Arch = simd::default_arch>
void top_entries(std::span<const float> logits, std::size_t m, std::vector<row_entry>& out) {
  out.clear();
  if (m == 0) return;
  const float* x = logits.data();
  const std::size_t n = logits.size();
  // out is a heap whose front is the worst kept entry (better_entry is the heap's "less").
  std::size_t i = 0;
  for (; i < n && out.size() < m; ++i) {
    if (!(x[i] > -std::numeric_limits<float>::infinity())) continue;  // -inf or NaN
    out.push_back({x[i], static_cast<token_id>(i)});
    std::push_heap(out.begin(), out.end(), better_entry);
  }
  if (out.size() == m) {
    // Later entries have larger indices, so one equal to the worst kept value ranks below it:
    // only a strictly greater value enters.
    float threshold = out.front().value;
    auto offer = [&](std::size_t j) {
      if (x[j] > threshold) {
        std::pop_heap(out.begin(), out.end(), better_entry);
        out.back() = {x[j], static_cast<token_id>(j)};
        std::push_heap(out.begin(), out.end(), better_entry);
        threshold = out.front().value;
      }
    };
    if constexpr (!simd::is_scalar_v<Arch>) {
      using batch = xsimd::batch<float, Arch>;
      constexpr std::size_t lanes = batch::size;
      for (; i < n && i % lanes != 0; ++i) offer(i);
      for (; i + lanes <= n; i += lanes)
        if (xsimd::any(batch::load_unaligned(x + i) > batch(threshold)))
          for (std::size_t j = i; j < i + lanes; ++j) offer(j);
    }
    for (; i < n; ++i) offer(i);
  }
  std::sort_heap(out.begin(), out.end(), better_entry);  // ascending by "less" = best first
}

}  // namespace llmkit::search::detail

LLMKIT_SIMD_DIAGNOSTICS_END
