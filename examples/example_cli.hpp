// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/example_cli.hpp
/// What every example program's command line shares: progress output that
/// only a terminal gets, a thread count sized to the model, and count
/// options that reject zero or negative values with a message of their own.

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

namespace llmkit_examples {

/// True when stderr is a terminal: progress bars redraw a line with '\r',
/// which a log file or a pipe would keep as one long line per redraw.
inline bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

/// Weight bytes one decode step should read per thread before a second
/// thread pays off: below it the pool's hand-off per layer costs more than
/// the split saves (stories260K, ~1 MB per step, decodes faster on one
/// thread than on two; the synthetic ~100M model, ~400 MB, on two).
inline constexpr std::size_t min_weight_bytes_per_thread = std::size_t{8} << 20;

/// The default thread count for a model that reads `weight_bytes_per_step`
/// bytes of weights per decode step: one thread per
/// `min_bytes_per_thread`, at least 1, at most the hardware threads.
inline std::size_t default_threads(std::size_t weight_bytes_per_step,
                                   std::size_t min_bytes_per_thread = min_weight_bytes_per_thread) {
  const std::size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp<std::size_t>(weight_bytes_per_step / std::max<std::size_t>(min_bytes_per_thread, 1), 1, hardware);
}

/// A CLI11 check for a count option: the value must be an integer >= `min`;
/// anything else fails with "got V: `why` (give `min` or more)", so
/// `--tokens 0` says that there is nothing to generate instead of printing
/// a numeric range.
inline CLI::Validator count_at_least(long long min, const std::string& why) {
  return CLI::Validator(
      [min, why](std::string& value) -> std::string {
        long long v = 0;
        if (!CLI::detail::lexical_cast(value, v)) return "got '" + value + "': not an integer";
        if (v < min) return "got " + value + ": " + why + " (give " + std::to_string(min) + " or more)";
        return {};
      },
      "INT>=" + std::to_string(min));
}

/// Options of `app` added after this call show their defaults in --help.
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

}  // namespace llmkit_examples
