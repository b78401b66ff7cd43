// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/candidates.hpp
/// The working set of one logits row as it passes through a processor chain.
///
/// A row starts *dense*: a view of the caller's `[vocab]` logits, which
/// processors modify in place (a removed token becomes -inf). Once a
/// truncation keeps few tokens (top-k, or top-p/min-p/typical keeping at most
/// 1/8 of the row) the set becomes *sparse*: `[n]` token ids and `[n]` logits
/// in buffers owned here, so later processors and the sampler touch only
/// those n entries. The distribution is the same either way: softmax over
/// the candidates, every other token having probability 0.
///
/// A `candidates` object is also the workspace of the row: keep one per
/// thread and reuse it, and no call allocates once buffers have grown to the
/// vocabulary size.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::sampling {

namespace detail {
/// Reusable buffers of the selection and sampling kernels.
struct scratch_buffers {
  aligned_vector<float> weights;
  aligned_vector<float> weights2;
  aligned_vector<std::uint32_t> keys;
  aligned_vector<std::uint32_t> index;
  aligned_vector<std::uint32_t> index2;
  aligned_vector<double> block_sums;
  aligned_vector<token_id> tokens;
  aligned_vector<token_id> tokens2;
  aligned_vector<std::int32_t> counts;
  /// Mass selection (detail/mass_select.hpp): the bracketed compact set and
  /// the undecided entries of the refinement (values, exp, indices).
  aligned_vector<float> compact_values, compact_weights, undecided_values, undecided_weights;
  aligned_vector<std::uint32_t> compact_index, undecided_index;
};

template <class V>
inline void grow(V& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}
}  // namespace detail

/// One row's candidate tokens and their logits (dense or sparse, see above).
class candidates {
 public:
  candidates() = default;

  /// Starts a row on `[vocab] logits`, which later steps modify in place.
  /// NaN entries become -inf.
  /// @throws llmkit::error if logits is empty, holds +inf, or every entry is
  /// -inf or NaN.
  void reset(std::span<float> logits) {
    LLMKIT_CHECK(!logits.empty(), "logits: the row is empty (vocab 0)");
    LLMKIT_CHECK(logits.size() <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
                 "logits: vocab ", logits.size(), " exceeds the int32 token range");
    dense_ = logits;
    sparse_ = false;
    sorted_ = false;
    n_ = logits.size();
    max_ = detail::sanitize_max(logits);
    max_known_ = true;
    LLMKIT_CHECK(max_ != -std::numeric_limits<float>::infinity(), "logits: every entry is -inf or NaN (vocab ",
                 logits.size(), ")");
  }

  /// Starts a row on a copy of `[vocab] logits` in the workspace's own
  /// buffer (the caller's row, e.g. a model's output, is left as it is); then
  /// as reset().
  /// @throws llmkit::error as reset() does.
  void reset_copy(std::span<const float> logits) {
    detail::grow(row_, logits.size());
    std::copy(logits.begin(), logits.end(), row_.begin());
    reset(std::span<float>(row_.data(), logits.size()));
  }

  /// Vocabulary size of the row.
  std::size_t vocab_size() const noexcept { return dense_.size(); }
  /// True while the row is the caller's dense logits.
  bool is_dense() const noexcept { return !sparse_; }
  /// Entries in `values()`: the vocabulary when dense, the kept tokens when sparse.
  std::size_t size() const noexcept { return n_; }
  /// `[size()]` logits; entry i belongs to `token(i)`.
  std::span<float> values() noexcept { return sparse_ ? std::span<float>(values_.data(), n_) : dense_; }
  std::span<const float> values() const noexcept {
    return sparse_ ? std::span<const float>(values_.data(), n_) : std::span<const float>(dense_);
  }
  /// Token id of entry i.
  token_id token(std::size_t i) const noexcept { return sparse_ ? ids_[i] : static_cast<token_id>(i); }
  /// `[size()]` token ids when sparse (empty when dense).
  std::span<const token_id> ids() const noexcept {
    return sparse_ ? std::span<const token_id>(ids_.data(), n_) : std::span<const token_id>{};
  }
  /// True when sparse and ordered by logit descending, then token ascending.
  bool is_sorted() const noexcept { return sparse_ && sorted_; }

  /// Largest logit among the candidates (cached between calls).
  float max() noexcept {
    if (!max_known_) {
      max_ = detail::max_value(values());
      max_known_ = true;
    }
    return max_;
  }
  /// Processors call this after changing values arbitrarily (the maximum
  /// and the sorted order are forgotten).
  void values_changed() noexcept {
    max_known_ = false;
    sorted_ = false;
  }
  /// ... or after an order-preserving change whose new maximum is `new_max`.
  void values_changed_monotone(float new_max) noexcept {
    max_ = new_max;
    max_known_ = true;
  }

  /// Keeps the entries i with keep(i) true (`n_keep` of them), in order.
  /// Dense rows with n_keep <= vocab / 8 become sparse; otherwise removed
  /// entries are set to -inf. The maximum stays valid only if `keeps_max`.
  template <class Keep>
  void retain(Keep&& keep, std::size_t n_keep, bool keeps_max = true) {
    if (n_keep == n_) return;
    if (!sparse_) {
      if (n_keep * 8 <= n_) {
        detail::grow(ids_, n_keep);
        detail::grow(values_, n_keep);
        std::size_t w = 0;
        for (std::size_t i = 0; i < n_ && w < n_keep; ++i) {
          if (keep(i)) {
            ids_[w] = static_cast<token_id>(i);
            values_[w] = dense_[i];
            ++w;
          }
        }
        LLMKIT_ASSERT(w == n_keep);
        sparse_ = true;
        sorted_ = false;
        n_ = w;
      } else {
        // Branch-free so the compiler can vectorise it.
        constexpr float neg_inf = -std::numeric_limits<float>::infinity();
        float* v = dense_.data();
        for (std::size_t i = 0; i < n_; ++i) v[i] = keep(i) ? v[i] : neg_inf;
      }
    } else {
      std::size_t w = 0;
      for (std::size_t i = 0; i < n_; ++i) {
        if (keep(i)) {
          ids_[w] = ids_[i];
          values_[w] = values_[i];
          ++w;
        }
      }
      LLMKIT_ASSERT(w == n_keep);
      n_ = w;
    }
    if (!keeps_max) max_known_ = false;
  }

  /// Keeps the entries whose logit v satisfies the predicate, given both as
  /// `keep_batch(xsimd::batch<float, Arch>) -> batch_bool` and
  /// `keep_value(float) -> bool`, in order; `n_keep_estimate` (about how many
  /// are kept) picks dense masking or a sparse gather as in `retain`.
  /// Vectorised (AVX-512: in-register compression for the gather).
  template <class Arch = simd::default_arch, class KeepBatch, class KeepValue>
  void retain_values(KeepBatch&& keep_batch, KeepValue&& keep_value, std::size_t n_keep_estimate,
                     bool keeps_max = true) {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    if (sparse_) {
      const float* v = values_.data();
      std::size_t n_keep = 0;
      for (std::size_t i = 0; i < n_; ++i) n_keep += keep_value(v[i]) ? 1 : 0;
      retain([&](std::size_t i) { return keep_value(v[i]); }, n_keep, keeps_max);
      return;
    }
    float* v = dense_.data();
    std::size_t i = 0;
    if (n_keep_estimate * 8 <= n_) {
      detail::grow(ids_, n_ + 64);
      detail::grow(values_, n_ + 64);
      std::size_t w = 0;
      i = gather_lanes<Arch>(v, keep_batch, w, simd::kernel_arch<Arch>{});
      for (; i < n_; ++i) {
        if (keep_value(v[i])) {
          ids_[w] = static_cast<token_id>(i);
          values_[w] = v[i];
          ++w;
        }
      }
      sparse_ = true;
      sorted_ = false;
      n_ = w;
    } else {
      if constexpr (!simd::is_scalar_v<Arch>) {
        using fb = xsimd::batch<float, Arch>;
        for (; i + fb::size <= n_; i += fb::size) {
          const fb x = fb::load_unaligned(v + i);
          xsimd::select(keep_batch(x), x, fb(neg_inf)).store_unaligned(v + i);
        }
      }
      for (; i < n_; ++i) v[i] = keep_value(v[i]) ? v[i] : neg_inf;
    }
    if (!keeps_max) max_known_ = false;
  }

  /// The order of entries given to assign_sparse.
  enum class order : std::uint8_t {
    any,     ///< no particular order
    sorted,  ///< logit descending, then token ascending
  };

  /// Replaces the set by `[n] ids` and `[n] values` (a sparse set) in the
  /// given order.
  /// @pre ids.size() == values.size() >= 1
  void assign_sparse(std::span<const token_id> ids, std::span<const float> values, order given) {
    LLMKIT_ASSERT(ids.size() == values.size() && !ids.empty());
    detail::grow(ids_, ids.size());
    detail::grow(values_, values.size());
    std::copy(ids.begin(), ids.end(), ids_.begin());
    std::copy(values.begin(), values.end(), values_.begin());
    n_ = ids.size();
    sparse_ = true;
    sorted_ = given == order::sorted;
    max_known_ = false;
  }

  /// Calls fn(i, r) for every entry i whose token is `tokens[r]`.
  /// `[m] tokens` sorted ascending, unique, each in [0, vocab).
  template <class Fn>
  void for_tokens(std::span<const token_id> tokens, Fn&& fn) {
    if (tokens.empty()) return;
    if (!sparse_) {
      for (std::size_t r = 0; r < tokens.size(); ++r) fn(static_cast<std::size_t>(tokens[r]), r);
    } else {
      for (std::size_t i = 0; i < n_; ++i) {
        const auto it = std::lower_bound(tokens.begin(), tokens.end(), ids_[i]);
        if (it != tokens.end() && *it == ids_[i]) fn(i, static_cast<std::size_t>(it - tokens.begin()));
      }
    }
  }

  /// Writes the processed row as `[vocab] out` logits (-inf for tokens that
  /// are not candidates). `out` may be the row `reset` was given.
  void to_logits(std::span<float> out) const {
    LLMKIT_CHECK(out.size() == vocab_size(), "candidates::to_logits: out.size() = ", out.size(),
                 " differs from vocab ", vocab_size());
    if (!sparse_) {
      if (out.data() != dense_.data()) std::copy(dense_.begin(), dense_.end(), out.begin());
      return;
    }
    std::fill(out.begin(), out.end(), -std::numeric_limits<float>::infinity());
    for (std::size_t i = 0; i < n_; ++i) out[static_cast<std::size_t>(ids_[i])] = values_[i];
  }

  /// Work buffers of the kernels (implementation detail).
  detail::scratch_buffers& scratch() noexcept { return scratch_; }

 private:
  /// retain_values' sparse gather over whole registers of `[n_] v`, one
  /// overload per instruction set (`gather_lanes<Arch>(v, keep_batch, w,
  /// kernel_arch<Arch>{})`): writes the kept entries to ids_ / values_ from w
  /// on and returns the entry it stopped at. The fallback has no such loop.
  template <class Arch, class KeepBatch>
  std::size_t gather_lanes(const float*, KeepBatch&, std::size_t&, simd::requires_arch<xsimd::generic>) {
    return 0;
  }

#if defined(__AVX512F__)
  /// In-register compression (ids_ and values_ hold n_ + 16).
  template <class Arch, class KeepBatch>
  std::size_t gather_lanes(const float* v, KeepBatch& keep_batch, std::size_t& w,
                           simd::requires_arch<xsimd::avx512f>) {
    using fb = xsimd::batch<float, Arch>;
    __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    std::size_t i = 0;
    for (; i + 16 <= n_; i += 16) {
      const __m512 x = _mm512_loadu_ps(v + i);
      const __mmask16 keep = static_cast<__mmask16>(keep_batch(fb(x)));
      if (keep != 0) {
        _mm512_storeu_si512(ids_.data() + w, _mm512_maskz_compress_epi32(keep, index));
        _mm512_storeu_ps(values_.data() + w, _mm512_maskz_compress_ps(keep, x));
        w += static_cast<std::size_t>(__builtin_popcount(keep));
      }
      index = _mm512_add_epi32(index, step);
    }
    return i;
  }
#endif

  std::span<float> dense_{};
  bool sparse_ = false;
  bool sorted_ = false;
  std::size_t n_ = 0;
  float max_ = 0.0f;
  bool max_known_ = false;
  aligned_vector<token_id> ids_;
  aligned_vector<float> values_;
  aligned_vector<float> row_;  // [vocab] copy of a const row (reset_copy)
  detail::scratch_buffers scratch_;
};

}  // namespace llmkit::sampling

LLMKIT_SIMD_DIAGNOSTICS_END
