// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/runtime_chain.hpp
/// Run-time processor chains: type-erased processors in a vector, built in
/// code or parsed from a configuration string such as
///   "penalties(repeat=1.1,last_n=64);top_k(40);top_p(0.95);temperature(0.8);sample"
/// A chain runs exactly the processor objects a compiled `processor_chain`
/// would, in the same order, so both give identical tokens.
///
/// Syntax: items separated by ';' (blanks ignored), each `name` or
/// `name(arguments)`; arguments separated by ',', positional or `key=value`.
///   temperature(t)                      t <= 0 means greedy
///   top_k(k)                            0 disables; k > vocab is clamped
///   top_p(p)   min_p(p)   typical(p)    (typical_p is an alias)
///   penalties(repeat=1,frequency=0,presence=0,last_n=64)
///   logit_bias(token=bias,...)          e.g. logit_bias(2=-inf,15=1.5)
///   no_repeat_ngram(n)
///   banned(1 2 3|4 5)                   token sequences separated by '|'
///   min_length(n,eos=2 3)               EOS ids separated by blanks
///   sample | categorical | greedy       the sampler; last item; default sample
/// Errors raise llmkit::error naming the item, the argument and the text.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/banned_sequences.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/categorical.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/greedy.hpp"
#include "llmkit/sampling/logit_bias.hpp"
#include "llmkit/sampling/min_length.hpp"
#include "llmkit/sampling/min_p.hpp"
#include "llmkit/sampling/no_repeat_ngram.hpp"
#include "llmkit/sampling/penalties.hpp"
#include "llmkit/sampling/temperature.hpp"
#include "llmkit/sampling/top_k.hpp"
#include "llmkit/sampling/top_p.hpp"
#include "llmkit/sampling/typical_p.hpp"

namespace llmkit::sampling {

/// llama.cpp's default sampler settings in llmkit's recommended order:
/// history-based edits first (they need the raw logits), then truncations
/// from the cheapest and most selective, temperature last (so min-p and
/// top-p see the model's own distribution), then the draw.
inline constexpr std::string_view default_chain_config =
    "penalties(repeat=1,frequency=0,presence=0,last_n=64);top_k(40);top_p(0.95);min_p(0.05);temperature(0.8);sample";

/// Any `logits_processor`, type-erased (copies share the immutable processor).
class any_processor {
 public:
  template <logits_processor P>
    requires(!std::is_same_v<std::remove_cvref_t<P>, any_processor>)
  any_processor(P processor) : self_(std::make_shared<model<P>>(std::move(processor))) {}

  void apply(candidates& c, const sampling_context& ctx) const { self_->apply(c, ctx); }

 private:
  struct interface {
    virtual ~interface() = default;
    virtual void apply(candidates& c, const sampling_context& ctx) const = 0;
  };
  template <class P>
  struct model final : interface {
    explicit model(P p) : processor_(std::move(p)) {}
    void apply(candidates& c, const sampling_context& ctx) const override { processor_.apply(c, ctx); }
    P processor_;
  };
  std::shared_ptr<const interface> self_;
};

/// A processor chain and its sampler chosen at run time; both a
/// `logits_processor` and a `sampler`.
class runtime_chain {
 public:
  runtime_chain() = default;
  runtime_chain(std::vector<any_processor> processors, std::variant<categorical, greedy> sampler = categorical{})
      : processors_(std::move(processors)), sampler_(sampler) {}

  /// Builds a chain from a configuration string (syntax above).
  /// @throws llmkit::error describing the first problem in `config`.
  static runtime_chain parse(std::string_view config);

  void apply(candidates& c, const sampling_context& ctx) const {
    for (const auto& p : processors_) p.apply(c, ctx);
  }
  sample_result sample(candidates& c, const sampling_context& ctx) const {
    return std::visit([&](const auto& s) { return s.sample(c, ctx); }, sampler_);
  }
  /// Appends a processor at the end of the chain.
  void push_back(any_processor p) { processors_.push_back(std::move(p)); }
  std::size_t size() const noexcept { return processors_.size(); }
  bool is_greedy() const noexcept { return std::holds_alternative<greedy>(sampler_); }

 private:
  std::vector<any_processor> processors_;
  std::variant<categorical, greedy> sampler_;
};

}  // namespace llmkit::sampling

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/sampling/impl/runtime_chain.ipp"
#endif
