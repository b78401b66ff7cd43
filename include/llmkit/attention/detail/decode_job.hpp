// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_job.hpp
/// What one `decode` call hands its tasks (`decode_job`) and how many query
/// heads a kernel pass takes. decode_params and decode_workspace are
/// declared here and defined in attention/decode.hpp; the task templates
/// use them only once decode() instantiates them.

#include <cstddef>

#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention {
struct decode_params;
struct decode_workspace;
}  // namespace llmkit::attention

namespace llmkit::attention::detail {

/// Everything a decode task needs; tasks are (split, KV head) pairs, the
/// splits of sequence i numbered [ws->task_first[i], ws->task_first[i + 1]).
template <class T>
struct decode_job {
  const decode_params* params = nullptr;  // complete where decode() instantiates a task
  chunk_source<T> source;
  mask_ref mask;
  decode_workspace* ws = nullptr;
  std::size_t group = 1;
  std::size_t n_kv_heads = 1;
  std::size_t head_dim = 0;
  std::size_t split_rows = 0;
  float scale = 1.0f;
  float* partial = nullptr;  // [n_tasks, group, head_dim + 2]
};

/// Heads per kernel pass for a GQA group of `group` heads: 1, 2 or 4 (a
/// group of 3 or more is padded to a multiple of 4 with zero queries).
constexpr std::size_t decode_head_batch(std::size_t group) { return group <= 2 ? group : 4; }

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
