// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/tuning.hpp
/// Per-call tuning of `decode` and `prefill` (`decode_params::tuning`,
/// `prefill_params::tuning`) and its defaults for the CPU the program runs
/// on. Tuning changes speed only: every setting gives results within the
/// tested tolerances, and the AMX switch gives the same bits.
///
/// @code
///   attention::decode({.q = q, .out = out, .seq_ids = ids, .n_heads = 32,
///                      .tuning = {.prefetch_bytes = 0}}, cache);  // no prefetching
/// @endcode

#include <algorithm>
#include <cstddef>
#include <limits>

namespace llmkit::attention {

/// How far ahead of its reads (bytes of one K or V stream, for rows of
/// `row_bytes` bytes) decode prefetches by default on this CPU: the distance
/// must cover about one DRAM miss, so it grows with one core's read rate.
/// - AMD: 32 rows, at most 4 KiB (measured on a 2-vCPU EPYC Zen 5 VM, ~42 GB/s per core, 2026-12-02);
/// - others: 1 KiB (measured on a 2-vCPU Sapphire Rapids VM, ~16 GB/s per core, 2026-12-01; longer
///   distances there hold the line fill buffers for a whole DRAM round trip).
inline std::size_t default_decode_prefetch_bytes(std::size_t row_bytes) noexcept {
  static const bool amd = [] {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
#else
    return false;
#endif
  }();
  return amd ? std::min<std::size_t>(4096, 32 * row_bytes) : std::size_t{1024};
}

/// Tuning of one `decode` call (`decode_params::tuning`).
struct decode_tuning {
  /// `prefetch_bytes` value that picks `default_decode_prefetch_bytes` for
  /// the call's row size.
  static constexpr std::size_t cpu_default = std::numeric_limits<std::size_t>::max();
  /// How far ahead of the rows it reads (bytes of one K or V stream) decode
  /// prefetches, rounded to whole rows; 0 disables prefetching.
  std::size_t prefetch_bytes = cpu_default;
  /// int8 caches: score on Intel AMX tiles where the build targets AMX-INT8
  /// and Linux grants the tiles (same bits as the AVX-512 VNNI kernel);
  /// false always takes the VNNI kernel.
  bool use_amx = true;
  /// Split-KV tasks per executor thread when `kv_split_tokens` is 0, > 0:
  /// enough to balance uneven contexts (chosen on a 2-vCPU Sapphire Rapids VM, 2026-11-30).
  std::size_t split_tasks_per_thread = 4;
  /// Fewest keys per split-KV task when `kv_split_tokens` is 0, so the merge
  /// costs little against a task's reads (chosen on a 2-vCPU Sapphire Rapids VM, 2026-11-30).
  std::size_t min_split_tokens = 512;
};

/// Tuning of one `prefill` call (`prefill_params::tuning`).
struct prefill_tuning {
  /// Query rows (tokens x the heads sharing one KV head) per task, at least
  /// one token: the block the key tiles stream against (chosen on a 2-vCPU
  /// Sapphire Rapids VM, 2026-11-30).
  std::size_t query_rows = 64;
  /// Bytes per thread of f32 copies of 16-bit and int8 K and V tiles kept
  /// across a thread's consecutive tasks: about one core's L2 (measured on a
  /// 2-vCPU Sapphire Rapids VM, 2 MiB L2, 2026-12-01).
  std::size_t memo_bytes = 256 * 1024;
  /// Consecutive tasks per executor call, > 0, so a thread knows its next
  /// task (to prefetch its queries) while short runs keep the load balanced
  /// (chosen on a 2-vCPU Sapphire Rapids VM, 2026-11-30).
  std::size_t run_length = 4;
};

}  // namespace llmkit::attention
