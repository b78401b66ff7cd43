// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/detail/streaming.hpp
/// The streaming callback of the generation drivers: called once per
/// committed token, it may cancel the generation by returning false.

#include <type_traits>

#include "llmkit/core/ids.hpp"

namespace llmkit::search {

namespace detail {
/// Calls `on_token(token)`; a callback returning bool may return false to
/// cancel the generation (this returns false then), a void one never does.
template <class OnToken>
bool notify(OnToken& on_token, token_id token) {
  if constexpr (std::is_same_v<decltype(on_token(token)), void>) {
    on_token(token);
    return true;
  } else {
    return static_cast<bool>(on_token(token));
  }
}

/// The default streaming callback: does nothing.
struct no_callback {
  void operator()(token_id) const noexcept {}
};
}  // namespace detail

}  // namespace llmkit::search
