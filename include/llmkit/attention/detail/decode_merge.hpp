// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_merge.hpp
/// The log-sum-exp merge of a sequence's split-KV partial results
/// (`decode_merge`).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "llmkit/attention/detail/decode_job.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// Merges the split-KV partials of batch sequence i, KV head h:
/// o = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
template <class T>
void decode_merge(const decode_job<T>& job, std::size_t i, std::size_t h) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const auto& p = *job.params;  // decode_params
  const std::size_t D = job.head_dim, stride = D + 2, group = job.group;
  const std::size_t first = job.ws->task_first[i];
  const std::size_t n_splits = job.ws->task_first[i + 1] - first;
  if (n_splits == 1) return;
  for (std::size_t g = 0; g < group; ++g) {
    auto record = [&](std::size_t sp) { return job.partial + (((first + sp) * job.n_kv_heads + h) * group + g) * stride; };
    float m_all = ninf;
    for (std::size_t sp = 0; sp < n_splits; ++sp) m_all = std::max(m_all, record(sp)[D]);
    float* dst = p.out.data() + (i * p.n_heads + h * group + g) * D;
    std::fill(dst, dst + D, 0.0f);
    if (m_all == ninf) continue;  // no visible key at all: zeros
    float l_all = 0.0f;
    for (std::size_t sp = 0; sp < n_splits; ++sp) {
      const float* rec = record(sp);
      if (rec[D] == ninf) continue;
      const float w = std::exp(rec[D] - m_all);
      l_all += rec[D + 1] * w;
      for (std::size_t d = 0; d < D; ++d) dst[d] += rec[d] * w;
    }
    l_all = with_sink(l_all, m_all, p.sinks, h * group + g);
    const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
    for (std::size_t d = 0; d < D; ++d) dst[d] *= inv;
  }
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
