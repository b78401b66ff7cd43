// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/error.hpp
/// The one exception type of llmkit and the two checking macros.
///
/// - `LLMKIT_CHECK(cond, parts...)` guards the public API: when `cond` is
///   false it throws `llmkit::error` whose message is the parts streamed one
///   after another. Name the argument and its value:
///   `LLMKIT_CHECK(k >= 0, "top_k: k must be >= 0, got ", k);`
/// - `LLMKIT_ASSERT(cond)` states an internal invariant. It is active in debug
///   and sanitizer builds (or wherever `LLMKIT_ENABLE_ASSERTS` is defined) and
///   aborts with the file and line; a caller can never trigger it.

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace llmkit {

/// Raised for every precondition a caller can violate. `what()` names the
/// argument and the offending value.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
/// Streams `parts` into one message and throws `llmkit::error`.
template <class... Parts>
[[noreturn]] inline void throw_error(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw error(message.str());
}

[[noreturn]] inline void assert_failed(const char* expression, const char* file, int line) {
  std::fprintf(stderr, "llmkit: internal invariant failed: %s (%s:%d)\n", expression, file, line);
  std::abort();
}
}  // namespace detail
}  // namespace llmkit

/// Throws `llmkit::error` built from the message parts when `cond` is false.
#define LLMKIT_CHECK(cond, ...)                                    \
  do {                                                             \
    if (!(cond)) [[unlikely]] ::llmkit::detail::throw_error(__VA_ARGS__); \
  } while (false)

#if !defined(LLMKIT_ENABLE_ASSERTS) && !defined(NDEBUG)
#define LLMKIT_ENABLE_ASSERTS 1
#endif

#if defined(LLMKIT_ENABLE_ASSERTS)
/// Aborts when an internal invariant does not hold (debug/sanitizer builds).
#define LLMKIT_ASSERT(cond) \
  do {                      \
    if (!(cond)) [[unlikely]] ::llmkit::detail::assert_failed(#cond, __FILE__, __LINE__); \
  } while (false)
#else
#define LLMKIT_ASSERT(cond) static_cast<void>(0)
#endif
