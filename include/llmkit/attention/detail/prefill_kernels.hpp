// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/prefill_kernels.hpp
/// The micro-kernels of the tiled (flash-attention style) prefill, for one
/// block of query rows against one tile of at most `key_tile` keys. They
/// depend only on (Arch, D), not on the cache or mask, so every cache type
/// and mask shares one instantiation.
///
/// Layouts (qld = query rows rounded up to whole registers):
///   qt  [D, qld]       queries, transposed, pre-multiplied by the scale
///   st  [key_tile, qld] scores, transposed: keys x query rows; softmax then
///                       runs down columns with whole registers of rows
///   o   [rows, D]      un-normalised output rows
///   k,v [n_keys] pointers to f32 rows of D elements
/// Transposing Q (once per query block) instead of K (once per key tile)
/// lets K and V rows be read in place, straight from an f32 cache.

#include <algorithm>
#include <cstddef>
#include <limits>

#include "llmkit/attention/detail/vec.hpp"

namespace llmkit::attention::detail {

template <class Arch, std::size_t D>
struct prefill_kernels {
  using V = vec<Arch>;
  static constexpr std::size_t L = lanes<Arch>;
  static constexpr std::size_t key_tile = 32;
  static_assert(D % L == 0, "prefill_kernels: head_dim must be a multiple of the register width");
  static constexpr std::size_t DV = D / L;

  /// st[j, r] = sum_d qt[d, r] * k[j][d] for j < n_keys, r < n_rv * L.
  static void scores(const float* qt, std::size_t qld, std::size_t n_rv, const float* const* k, std::size_t n_keys,
                     float* st) noexcept {
    for (std::size_t rv0 = 0; rv0 < n_rv; rv0 += 4) {
      const float* q = qt + rv0 * L;
      float* s = st + rv0 * L;
      switch (std::min<std::size_t>(4, n_rv - rv0)) {
        case 4: scores_rows<4>(q, qld, k, n_keys, s); break;
        case 3: scores_rows<3>(q, qld, k, n_keys, s); break;
        case 2: scores_rows<2>(q, qld, k, n_keys, s); break;
        default: scores_rows<1>(q, qld, k, n_keys, s); break;
      }
    }
  }

  /// x = cap * tanh(x / cap) on st[j, r], j < n_keys, r < n_rv * L.
  static void soft_cap(float* st, std::size_t qld, std::size_t n_rv, std::size_t n_keys, float cap) noexcept {
    const V c(cap), inv(1.0f / cap);
    for (std::size_t j = 0; j < n_keys; ++j)
      for (std::size_t rv = 0; rv < n_rv; ++rv) {
        float* p = st + j * qld + rv * L;
        vstore<Arch>(p, c * vtanh<Arch>(vload<Arch>(p) * inv));
      }
  }

  /// Online softmax step over one key tile. Per query row r: m[r] becomes
  /// max(m[r], max_j st[j, r]); alpha[r] = exp(m_old - m_new) rescales the
  /// previous sums; st[j, r] becomes exp(st[j, r] - m_new); l[r] is
  /// rescaled and increased by the new row sum. Rows that have seen only
  /// hidden keys (-inf) keep m = -inf and get p = 0, never NaN.
  static void softmax_update(float* st, std::size_t qld, std::size_t n_rv, std::size_t n_keys, float* m, float* l,
                             float* alpha) noexcept {
    const V ninf(-std::numeric_limits<float>::infinity());
    for (std::size_t rv = 0; rv < n_rv; ++rv) {
      float* col = st + rv * L;
      V tile_max = ninf;
      for (std::size_t j = 0; j < n_keys; ++j) tile_max = vmax<Arch>(tile_max, vload<Arch>(col + j * qld));
      const V m_old = vload<Arch>(m + rv * L);
      const V m_new = vmax<Arch>(m_old, tile_max);
      const V shift = vfinite_or_zero<Arch>(m_new);
      const V a = vexp<Arch>(m_old - shift);
      V sum0(0.0f), sum1(0.0f);
      std::size_t j = 0;
      for (; j + 2 <= n_keys; j += 2) {
        const V p0 = vexp<Arch>(vload<Arch>(col + j * qld) - shift);
        const V p1 = vexp<Arch>(vload<Arch>(col + (j + 1) * qld) - shift);
        vstore<Arch>(col + j * qld, p0);
        vstore<Arch>(col + (j + 1) * qld, p1);
        sum0 = sum0 + p0;
        sum1 = sum1 + p1;
      }
      if (j < n_keys) {
        const V p0 = vexp<Arch>(vload<Arch>(col + j * qld) - shift);
        vstore<Arch>(col + j * qld, p0);
        sum0 = sum0 + p0;
      }
      vstore<Arch>(m + rv * L, m_new);
      vstore<Arch>(alpha + rv * L, a);
      vstore<Arch>(l + rv * L, vfma<Arch>(vload<Arch>(l + rv * L), a, sum0 + sum1));
    }
  }

  /// o[r, :] = alpha[r] * o[r, :] + sum_j pt[j, r] * v[j][:] for r < n_rows.
  static void accumulate(float* o, std::size_t n_rows, const float* alpha, const float* pt, std::size_t qld,
                         const float* const* v, std::size_t n_keys) noexcept {
    std::size_t r = 0;
    for (; r + 4 <= n_rows; r += 4) accumulate_rows<4>(o + r * D, alpha + r, pt + r, qld, v, n_keys);
    for (; r < n_rows; ++r) accumulate_rows<1>(o + r * D, alpha + r, pt + r, qld, v, n_keys);
  }

  /// out[r] = o[r] / l[r] (zeros where l[r] == 0: a fully masked row).
  static void finish_row(const float* o, float l, float* out) noexcept {
    const V inv(l > 0.0f ? 1.0f / l : 0.0f);
    for (std::size_t c = 0; c < DV; ++c) vstore<Arch>(out + c * L, vload<Arch>(o + c * L) * inv);
  }

 private:
  // A register tile of JR keys x RV row-registers; JR * RV accumulators.
  template <std::size_t RV, std::size_t JR>
  static void scores_block(const float* qt, std::size_t qld, const float* const* k, float* st) noexcept {
    V acc[JR][RV];
    for (std::size_t j = 0; j < JR; ++j)
      for (std::size_t r = 0; r < RV; ++r) acc[j][r] = V(0.0f);
    const float* kj[JR];
    for (std::size_t j = 0; j < JR; ++j) kj[j] = k[j];
    for (std::size_t d = 0; d < D; ++d) {
      V qv[RV];
      for (std::size_t r = 0; r < RV; ++r) qv[r] = vload<Arch>(qt + d * qld + r * L);
      for (std::size_t j = 0; j < JR; ++j) {
        const V kb(kj[j][d]);
        for (std::size_t r = 0; r < RV; ++r) acc[j][r] = vfma<Arch>(kb, qv[r], acc[j][r]);
      }
    }
    for (std::size_t j = 0; j < JR; ++j)
      for (std::size_t r = 0; r < RV; ++r) vstore<Arch>(st + j * qld + r * L, acc[j][r]);
  }

  template <std::size_t RV>
  static void scores_rows(const float* qt, std::size_t qld, const float* const* k, std::size_t n_keys,
                          float* st) noexcept {
    // 4 keys x 4 registers of rows = 16 accumulators (of 32 AVX-512 registers).
    std::size_t j = 0;
    for (; j + 4 <= n_keys; j += 4) scores_block<RV, 4>(qt, qld, k + j, st + j * qld);
    for (; j < n_keys; ++j) scores_block<RV, 1>(qt, qld, k + j, st + j * qld);
  }

  template <std::size_t MR, std::size_t CB>
  static void accumulate_block(float* o, const float* alpha, const float* pt, std::size_t qld,
                               const float* const* v, std::size_t n_keys, std::size_t c0) noexcept {
    V acc[MR][CB];
    for (std::size_t r = 0; r < MR; ++r) {
      const V a(alpha[r]);
      for (std::size_t c = 0; c < CB; ++c) acc[r][c] = vload<Arch>(o + r * D + c0 + c * L) * a;
    }
    for (std::size_t j = 0; j < n_keys; ++j) {
      const float* vj = v[j] + c0;
      V vv[CB];
      for (std::size_t c = 0; c < CB; ++c) vv[c] = vload<Arch>(vj + c * L);
      for (std::size_t r = 0; r < MR; ++r) {
        const V p(pt[j * qld + r]);
        for (std::size_t c = 0; c < CB; ++c) acc[r][c] = vfma<Arch>(p, vv[c], acc[r][c]);
      }
    }
    for (std::size_t r = 0; r < MR; ++r)
      for (std::size_t c = 0; c < CB; ++c) vstore<Arch>(o + r * D + c0 + c * L, acc[r][c]);
  }

  template <std::size_t MR>
  static void accumulate_rows(float* o, const float* alpha, const float* pt, std::size_t qld, const float* const* v,
                              std::size_t n_keys) noexcept {
    // MR rows x 4 column registers; the remainder of D / L in one narrower block.
    constexpr std::size_t full = DV / 4;
    constexpr std::size_t rest = DV % 4;
    for (std::size_t cb = 0; cb < full; ++cb) accumulate_block<MR, 4>(o, alpha, pt, qld, v, n_keys, cb * 4 * L);
    if constexpr (rest > 0) accumulate_block<MR, rest>(o, alpha, pt, qld, v, n_keys, full * 4 * L);
  }
};

}  // namespace llmkit::attention::detail
