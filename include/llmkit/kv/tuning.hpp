// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/tuning.hpp
/// The microarchitecture constants of the caches' `store`. They change speed
/// only, never the stored rows. Each says what it was measured on.

#include <cstddef>
#include <type_traits>

#include "llmkit/core/dtype.hpp"
#include "llmkit/kv/storage.hpp"

namespace llmkit::kv::detail {

/// Tokens ahead of the one being stored whose rows `store` prefetches for
/// writing (`prefetch_for_write`; 0: none). A token's store writes
/// 2 x n_kv_heads rows to as many places, more write streams than the
/// hardware prefetchers follow; bf16 stores appended faster without it
/// (measured on a 2-vCPU AMD EPYC Zen 5 VM, 2026-12-03).
template <kv_storage T>
inline constexpr std::size_t store_prefetch_tokens = std::is_same_v<T, bf16> ? 0 : 2;

}  // namespace llmkit::kv::detail
