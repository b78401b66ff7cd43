// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/prefill_job.hpp
/// What one `prefill` call hands its tasks: the query tiles, the mask's
/// hooks and the call's id (`prefill_job`). prefill_params is declared here
/// and defined in attention/prefill.hpp; the task templates use it only once
/// prefill() instantiates them.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"
#include "llmkit/attention/mask.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention {
struct prefill_params;
}  // namespace llmkit::attention

namespace llmkit::attention::detail {

struct prefill_tile_desc {
  std::size_t seq;            // index into the batch
  std::size_t first_token;    // index of the tile's first token in the batch
  std::size_t n_tokens;       // tokens in the tile
  std::int32_t first_pos;     // position of its first token
};

/// Everything a prefill task needs; tasks are (tile, KV head) pairs, task
/// = h * tiles.size() + tile: head-major, so the tasks a thread runs one
/// after another read the same KV head's rows, which stay in its L2.
template <class T>
struct prefill_job {
  const prefill_params* params = nullptr;  // complete where prefill() instantiates a task
  chunk_source<T> source;
  mask_ref mask;  // classify
  /// key_end[t] = 1 + the last j < n_keys with visible(q_first + t, k_pos[j])
  /// (0: none), for t < n_tokens.
  void (*key_ends)(const void*, std::size_t n_tokens, position q_first, const position* k_pos, std::size_t n_keys,
                   std::uint32_t* key_end) = nullptr;
  /// st[j * ld + t * group + g] = -inf where !visible(q_first + t, k_pos[j]),
  /// for j < n_keys, t < n_tokens, g < group (key_end from key_ends: no
  /// mask test past it).
  void (*apply_mask)(const void*, float* st, std::size_t ld, std::size_t n_tokens, std::size_t group,
                     position q_first, const position* k_pos, std::size_t n_keys,
                     const std::uint32_t* key_end) = nullptr;
  std::uint64_t call = 0;  ///< distinct per prefill() call (keys the converted-tile memo)
  std::size_t group = 1;
  std::size_t n_kv_heads = 1;
  float scale = 1.0f;
  std::vector<prefill_tile_desc> tiles;
};

/// Query tokens per task: about `query_rows` query rows (tokens x the heads
/// sharing one KV head) per block.
inline std::size_t prefill_tile_tokens(std::size_t group, std::size_t query_rows) {
  return std::max<std::size_t>(1, query_rows / group);
}

/// Query row r of (tile, KV head h) is token tile.first_token + r / group,
/// head h * group + r % group: the heads of one token that share KV head h
/// are adjacent in q and out.
template <std::size_t D, class Params>
inline std::size_t prefill_row_offset(const Params& p, const prefill_tile_desc& tile, std::size_t h,
                                      std::size_t group, std::size_t r) noexcept {
  return ((tile.first_token + r / group) * p.n_heads + h * group + r % group) * D;
}

/// Counts prefill() calls: the ids key the per-thread converted-tile memo,
/// which every call and instantiation shares, so the counter is atomic.
inline std::atomic<std::uint64_t> prefill_calls{0};

/// Sets job.key_ends and job.apply_mask to the tests of mask policy Mask.
template <class Mask, class T>
void set_mask_hooks(prefill_job<T>& job) {
  job.apply_mask = [](const void* m, float* st, std::size_t ld, std::size_t n_q, std::size_t g, position q_first,
                      const position* k_pos, std::size_t n_keys, const std::uint32_t* key_end) {
    const Mask& mk = *static_cast<const Mask*>(m);
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    for (std::size_t t = 0; t < n_q; ++t)
      for (std::size_t j = 0; j < n_keys; ++j)
        if (j >= key_end[t] || !mk.visible(q_first + static_cast<position>(t), k_pos[j]))
          std::fill_n(st + j * ld + t * g, g, ninf);
  };
  job.key_ends = [](const void* m, std::size_t n_q, position q_first, const position* k_pos, std::size_t n_keys,
                    std::uint32_t* key_end) {
    const Mask& mk = *static_cast<const Mask*>(m);
    for (std::size_t t = 0; t < n_q; ++t) {
      std::size_t end = n_keys;
      while (end > 0 && !mk.visible(q_first + static_cast<position>(t), k_pos[end - 1])) --end;
      key_end[t] = static_cast<std::uint32_t>(end);
    }
  };
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
