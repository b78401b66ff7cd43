// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/sequence_cache.hpp
/// What search strategies need from a KV cache: `sequence_cache<C>`, a
/// `kv::kv_cache` that manages sequences: `add_sequence() ->
/// optional<seq_id>`, `free`, `fork -> optional<seq_id>`, `truncate(s, n)`,
/// `n_tokens(s)` and `contains(s)`. Every llmkit cache offers these;
/// `paged_cache` forks by sharing blocks, `contiguous_cache` by copying.
/// What they need from a model is model::language_model
/// (model/language_model.hpp).

#include <concepts>
#include <cstddef>
#include <optional>
#include <utility>

#include "llmkit/core/error.hpp"
#include "llmkit/kv/kv_view.hpp"

namespace llmkit::search {

/// A KV cache whose sequences can be added, forked, rolled back and freed.
template <class C>
concept sequence_cache = kv::kv_cache<C> && requires(C& c, kv::seq_id s, std::size_t n) {
  { c.add_sequence() } -> std::same_as<std::optional<kv::seq_id>>;
  { c.fork(s) } -> std::same_as<std::optional<kv::seq_id>>;
  c.free(s);
  c.truncate(s, n);
  { c.n_tokens(s) } -> std::convertible_to<std::size_t>;
  { c.contains(s) } -> std::convertible_to<bool>;
};

namespace detail {
/// Frees a cache sequence when it goes out of scope (exception safety).
template <class Cache>
class sequence_guard {
 public:
  sequence_guard(Cache& cache, kv::seq_id s) : cache_(&cache), seq_(s) {}
  sequence_guard(const sequence_guard&) = delete;
  sequence_guard& operator=(const sequence_guard&) = delete;
  ~sequence_guard() {
    if (cache_ && cache_->contains(seq_)) cache_->free(seq_);
  }
  kv::seq_id get() const noexcept { return seq_; }

 private:
  Cache* cache_;
  kv::seq_id seq_;
};

/// Adds a sequence or throws naming the caller.
template <class Cache>
kv::seq_id add_sequence_or_throw(Cache& cache, const char* who) {
  const std::optional<kv::seq_id> s = cache.add_sequence();
  LLMKIT_CHECK(s.has_value(), who, ": the cache has no free sequence slot");
  return *s;
}
}  // namespace detail

}  // namespace llmkit::search
