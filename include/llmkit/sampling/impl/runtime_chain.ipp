// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/impl/runtime_chain.ipp
/// runtime_chain::parse and its argument parsing (sampling/runtime_chain.hpp):
/// compiled inline by the header, or once by <llmkit/src.hpp> with
/// LLMKIT_SEPARATE_COMPILATION.

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/runtime_chain.hpp"

namespace llmkit::sampling {

namespace detail {

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

template <class T>
T parse_number(std::string_view text, std::string_view item, std::string_view what) {
  text = trim(text);
  T value{};
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && text.front() == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, last, value);
  LLMKIT_CHECK(!text.empty() && ec == std::errc() && ptr == last, "sampling chain: ", item, ": ", what, " '", text,
               "' is not a valid ", std::is_integral_v<T> ? "integer" : "number");
  return value;
}

inline std::vector<token_id> parse_token_list(std::string_view text, std::string_view item, std::string_view what) {
  std::vector<token_id> tokens;
  text = trim(text);
  while (!text.empty()) {
    const std::size_t end = text.find_first_of(" \t");
    tokens.push_back(parse_number<token_id>(text.substr(0, end), item, what));
    text = end == std::string_view::npos ? std::string_view{} : trim(text.substr(end));
  }
  LLMKIT_CHECK(!tokens.empty(), "sampling chain: ", item, ": ", what, " is empty");
  return tokens;
}

/// One `key=value` or positional argument.
struct chain_argument {
  std::string_view key;
  std::string_view value;
};

inline std::vector<chain_argument> split_arguments(std::string_view args) {
  std::vector<chain_argument> out;
  if (trim(args).empty()) return out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = args.find(',', start);
    const std::string_view part = trim(args.substr(start, comma == std::string_view::npos ? args.npos : comma - start));
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) out.push_back({{}, part});
    else out.push_back({trim(part.substr(0, eq)), trim(part.substr(eq + 1))});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

/// Binds arguments to named parameters (positional in the order of `names`).
template <std::size_t N>
std::array<std::string_view, N> bind_arguments(std::string_view item, std::string_view args,
                                               const std::array<std::string_view, N>& names, std::size_t n_required) {
  std::array<std::string_view, N> bound{};
  std::array<bool, N> seen{};
  const auto list = split_arguments(args);
  LLMKIT_CHECK(list.size() <= N, "sampling chain: ", item, ": takes at most ", N, " argument(s), got ", list.size());
  for (std::size_t a = 0; a < list.size(); ++a) {
    std::size_t slot = a;
    if (!list[a].key.empty()) {
      slot = N;
      for (std::size_t j = 0; j < N; ++j)
        if (names[j] == list[a].key) slot = j;
      LLMKIT_CHECK(slot < N, "sampling chain: ", item, ": unknown parameter '", list[a].key, "'");
    }
    LLMKIT_CHECK(!seen[slot], "sampling chain: ", item, ": parameter '", names[slot], "' given twice");
    LLMKIT_CHECK(!list[a].value.empty(), "sampling chain: ", item, ": parameter '", names[slot], "' has no value");
    seen[slot] = true;
    bound[slot] = list[a].value;
  }
  for (std::size_t j = 0; j < n_required; ++j)
    LLMKIT_CHECK(seen[j], "sampling chain: ", item, ": missing parameter '", names[j], "'");
  return bound;
}

}  // namespace detail

LLMKIT_DECL runtime_chain runtime_chain::parse(std::string_view config) {
  using detail::bind_arguments;
  using detail::parse_number;
  runtime_chain chain;
  bool have_sampler = false;
  std::size_t pos = 0;
  while (pos <= config.size()) {
    std::size_t end = config.find(';', pos);
    if (end == std::string_view::npos) end = config.size();
    const std::string_view item = detail::trim(config.substr(pos, end - pos));
    pos = end + 1;
    if (item.empty()) continue;
    LLMKIT_CHECK(!have_sampler, "sampling chain: '", item, "' follows the sampler; the sampler must be the last item");
    const std::size_t open = item.find('(');
    const std::string_view name = detail::trim(item.substr(0, open));
    std::string_view args;
    if (open != std::string_view::npos) {
      LLMKIT_CHECK(item.back() == ')', "sampling chain: missing ')' at the end of '", item, "'");
      args = item.substr(open + 1, item.size() - open - 2);
      LLMKIT_CHECK(args.find_first_of("()") == std::string_view::npos, "sampling chain: unbalanced parentheses in '",
                   item, "'");
    }
    LLMKIT_CHECK(!name.empty(), "sampling chain: item '", item, "' has no name");
    auto add = [&](auto p) {
      p.validate();
      chain.processors_.emplace_back(std::move(p));
    };
    if (name == "temperature") {
      const auto a = bind_arguments<1>(name, args, {"t"}, 1);
      add(temperature{parse_number<float>(a[0], name, "t")});
    } else if (name == "top_k") {
      const auto a = bind_arguments<1>(name, args, {"k"}, 1);
      add(top_k{parse_number<std::int64_t>(a[0], name, "k")});
    } else if (name == "top_p") {
      const auto a = bind_arguments<1>(name, args, {"p"}, 1);
      add(top_p{parse_number<float>(a[0], name, "p")});
    } else if (name == "min_p") {
      const auto a = bind_arguments<1>(name, args, {"p"}, 1);
      add(min_p{parse_number<float>(a[0], name, "p")});
    } else if (name == "typical" || name == "typical_p") {
      const auto a = bind_arguments<1>(name, args, {"p"}, 1);
      add(typical_p{parse_number<float>(a[0], name, "p")});
    } else if (name == "penalties") {
      const auto a = bind_arguments<4>(name, args, {"repeat", "frequency", "presence", "last_n"}, 0);
      penalties p;
      if (!a[0].empty()) p.repeat = parse_number<float>(a[0], name, "repeat");
      if (!a[1].empty()) p.frequency = parse_number<float>(a[1], name, "frequency");
      if (!a[2].empty()) p.presence = parse_number<float>(a[2], name, "presence");
      if (!a[3].empty()) p.last_n = parse_number<std::int64_t>(a[3], name, "last_n");
      add(p);
    } else if (name == "logit_bias") {
      std::vector<std::pair<token_id, float>> biases;
      for (const auto& arg : detail::split_arguments(args)) {
        LLMKIT_CHECK(!arg.key.empty(), "sampling chain: logit_bias: argument '", arg.value,
                     "' is not of the form token=bias");
        biases.emplace_back(parse_number<token_id>(arg.key, name, "token"), parse_number<float>(arg.value, name, "bias"));
      }
      chain.processors_.emplace_back(logit_bias(std::move(biases)));
    } else if (name == "no_repeat_ngram") {
      const auto a = bind_arguments<1>(name, args, {"n"}, 1);
      add(no_repeat_ngram{parse_number<std::int64_t>(a[0], name, "n")});
    } else if (name == "banned") {
      std::vector<std::vector<token_id>> sequences;
      std::size_t start = 0;
      while (true) {
        const std::size_t bar = args.find('|', start);
        sequences.push_back(detail::parse_token_list(
            args.substr(start, bar == std::string_view::npos ? args.npos : bar - start), name, "sequence"));
        if (bar == std::string_view::npos) break;
        start = bar + 1;
      }
      chain.processors_.emplace_back(banned_sequences(std::move(sequences)));
    } else if (name == "min_length") {
      const auto a = bind_arguments<2>(name, args, {"n", "eos"}, 2);
      add(min_length{parse_number<std::int64_t>(a[0], name, "n"), detail::parse_token_list(a[1], name, "eos")});
    } else if (name == "sample" || name == "categorical" || name == "greedy") {
      LLMKIT_CHECK(detail::trim(args).empty(), "sampling chain: ", name, " takes no arguments, got '", args, "'");
      chain.sampler_ = name == "greedy" ? std::variant<categorical, greedy>(greedy{})
                                        : std::variant<categorical, greedy>(categorical{});
      have_sampler = true;
    } else {
      ::llmkit::detail::throw_error("sampling chain: unknown item '", name,
                          "' (known: temperature, top_k, top_p, min_p, typical, penalties, logit_bias, "
                          "no_repeat_ngram, banned, min_length, sample, greedy)");
    }
  }
  return chain;
}

}  // namespace llmkit::sampling
