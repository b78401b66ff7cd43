// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/language_model.hpp
/// The `language_model` concept (DESIGN's "Model"): what search strategies,
/// schedulers and prepacking drivers need from a model.
///
/// A model runs a packed batch (model/batch.hpp) against a KV cache on the
/// caller's executor (core/executor.hpp), appending the batch's K/V to the
/// cache, and returns the logits of the rows the batch asks for as a
/// `[n_logits, vocab_size()]` view that stays valid until its next
/// forward(). `kv_shape()` tells how to build the cache. `llama_model` is
/// the reference implementation; a user's own model only has to offer these
/// three members (a model that does not parallelise may ignore the executor).

#include <concepts>
#include <cstddef>

#include "llmkit/core/executor.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/model/batch.hpp"

namespace llmkit::model {

/// A causal language model over caches of type Cache, run on executors of
/// type Exec: `forward(batch, cache, exec) -> [n_logits, vocab] logits`.
template <class M, class Cache, class Exec = serial_executor>
concept language_model = kv::kv_cache<Cache> && executor<Exec> &&
                         requires(M& m, const M& cm, const batch& b, Cache& cache, Exec& exec) {
                           { cm.vocab_size() } -> std::convertible_to<std::size_t>;
                           { cm.kv_shape() } -> std::convertible_to<kv::kv_shape>;
                           { m.forward(b, cache, exec) } -> std::convertible_to<matrix_view<const float>>;
                         };

}  // namespace llmkit::model
