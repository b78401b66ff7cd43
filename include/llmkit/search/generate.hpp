// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/generate.hpp
/// The generation loop: prefill the prompt, then one forward per token,
/// each step's logits going through the request's processor chain and
/// sampler, until a stop rule fires. Greedy decoding is
/// `generate(m, cache, prompt, sampling::processor_chain<>{}, sampling::greedy{}, opts)`.
///
/// ```
/// const sampling::processor_chain chain{sampling::top_k{40}, sampling::temperature{0.8f}};
/// auto r = search::generate(model, cache, prompt, chain, sampling::categorical{},
///                           {.stop = {.max_new_tokens = 64, .eos_tokens = {2}}, .seed = 7},
///                           [](token_id t) { std::cout << t << ' '; });
/// ```

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/stop.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/chain.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/search/detail/streaming.hpp"
#include "llmkit/search/sequence_cache.hpp"

namespace llmkit::search {

/// Options of `generate`.
struct generate_options {
  stop_criteria stop{};          ///< EOS tokens, stop sequences, token budget
  std::uint64_t seed = 0;        ///< the request's sampling seed
  std::uint64_t request_id = 0;  ///< the request's id (second RNG key)
};

/// What `generate` produced.
struct generate_result {
  std::vector<token_id> tokens;  ///< [n_generated] generated tokens (stop tokens included)
  std::vector<float> logprobs;       ///< [n_generated] log-probability of each under the processed distribution
  finish_reason reason = finish_reason::max_tokens;
  std::size_t n_forward_passes = 0;  ///< model.forward calls (1 prefill + one per further token)
};

/// Generates a continuation of `[n_prompt] prompt` in a new sequence of
/// `cache` (freed before returning, also on error). `on_token(token)` is
/// called for every token as soon as it is chosen; when it returns false
/// (a bool-returning callback), generation stops with
/// `finish_reason::cancelled`, that token included. Every forward pass runs
/// on `exec` (serial by default; a thread_pool splits the model's products).
/// @throws llmkit::error for an empty prompt, bad options, a cache without
/// room, or whatever the model or the chain raise.
template <class Model, sequence_cache Cache, sampling::logits_processor Chain, sampling::sampler Sampler,
          class OnToken = detail::no_callback, class Exec = serial_executor>
  requires model::language_model<Model, Cache, std::remove_cvref_t<Exec>>
generate_result generate(Model& model, Cache& cache, std::span<const token_id> prompt, const Chain& chain,
                         const Sampler& pick, const generate_options& options, OnToken&& on_token = {},
                         Exec&& exec = Exec{}) {
  LLMKIT_CHECK(!prompt.empty(), "generate: prompt is empty (give at least one token, e.g. BOS)");
  options.stop.validate("generate");
  const std::size_t vocab = model.vocab_size();
  detail::sequence_guard<Cache> seq(cache, detail::add_sequence_or_throw(cache, "generate"));
  sampling::sampling_state state(options.seed, options.request_id, prompt);
  sampling::candidates workspace;
  generate_result out;
  model::batch_builder b;
  b.add(seq.get(), prompt, 0);
  for (;;) {
    const matrix_view<const float> logits = model.forward(b.view(), cache, exec);
    ++out.n_forward_passes;
    LLMKIT_CHECK(logits.rows() == 1 && logits.cols() == vocab, "generate: the model returned a [", logits.rows(), ", ",
                 logits.cols(), "] logits matrix, expected [1, ", vocab, "]");
    const sampling::sample_result r = sampling::sample_row(logits.row(0), state.context(), chain, pick, workspace);
    state.accept(r.token);
    out.tokens.push_back(r.token);
    out.logprobs.push_back(r.logprob);
    if (!detail::notify(on_token, r.token)) {
      out.reason = finish_reason::cancelled;
      break;
    }
    if (const auto why = options.stop.check(out.tokens)) {
      out.reason = *why;
      break;
    }
    b.clear();
    b.add(seq.get(), {&out.tokens.back(), 1}, static_cast<std::int32_t>(cache.n_tokens(seq.get())));
  }
  return out;
}

}  // namespace llmkit::search
