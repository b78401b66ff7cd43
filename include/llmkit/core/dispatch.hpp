// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/dispatch.hpp
/// Turns a run-time value into a compile-time one:
/// `dispatch<64, 80, 96, 128>(head_dim, [&](auto d) { kernel<d()>(...); });`
/// calls the lambda with `std::integral_constant<int, head_dim>`, or throws
/// `llmkit::error` naming the value when it is not in the list.

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "llmkit/core/error.hpp"

namespace llmkit {

template <auto... Candidates, class Value, class Fn>
decltype(auto) dispatch(Value value, Fn&& fn, const char* what = "value") {
  static_assert(sizeof...(Candidates) > 0, "dispatch: give at least one candidate value");
  constexpr auto first = std::get<0>(std::tuple{Candidates...});
  using result_t = std::invoke_result_t<Fn, std::integral_constant<decltype(first), first>>;
  if constexpr (std::is_void_v<result_t>) {
    const bool found = ((value == Candidates ? (fn(std::integral_constant<decltype(Candidates), Candidates>{}), true)
                                             : false) ||
                        ...);
    LLMKIT_CHECK(found, "dispatch: unsupported ", what, " ", value);
  } else {
    std::optional<result_t> out;
    static_cast<void>(
        ((value == Candidates ? (out.emplace(fn(std::integral_constant<decltype(Candidates), Candidates>{})), true)
                              : false) ||
         ...));
    LLMKIT_CHECK(out.has_value(), "dispatch: unsupported ", what, " ", value);
    return result_t(*std::move(out));
  }
}

}  // namespace llmkit
