// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/example_cli.hpp
/// What every example program's command line shares: a small command-line
/// parser (`command_line`, built on CLI11 once in examples/common/
/// example_cli.cpp, so no example compiles CLI11 itself), count options that
/// reject zero or negative values with a message of their own, progress
/// output that only a terminal gets, and a thread count sized to the model.

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

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

/// One option of a `command_line`, refined after it is added. Each call
/// returns the same option, so refinements chain:
/// `cli.add_option("--tokens", n_tokens, "...").count_at_least(1, "nothing to generate")`.
/// A check on a list option applies to each of its values.
class cli_option {
 public:
  /// The value must be an integer >= `min`; anything else fails with
  /// "got V: `why` (give `min` or more)", so `--tokens 0` says that there is
  /// nothing to generate instead of printing a numeric range.
  cli_option count_at_least(long long min, const std::string& why) const;
  /// The value must be an integer in [min, max].
  cli_option in_range(int min, int max) const;
  /// The value must be a number in [min, max] (read as a float).
  cli_option in_range(float min, float max) const;
  /// The value must be a number in [min, max] (read as a double).
  cli_option in_range(double min, double max) const;
  /// The value must be a number >= 0.
  cli_option non_negative() const;
  /// The value must be one of `allowed`, which --help lists.
  cli_option one_of(std::initializer_list<std::string> allowed) const;
  /// The value must be one of `allowed`, which --help lists.
  cli_option one_of(std::initializer_list<int> allowed) const;
  /// The value must be one of `allowed`, which --help lists.
  cli_option one_of(std::span<const std::string_view> allowed) const;
  /// A list option also splits each argument at `separator` (`--beams 1,4,16`).
  cli_option delimiter(char separator) const;
  /// Giving both this option and `other` is an error.
  cli_option excludes(cli_option other) const;
  /// Giving this option without `other` is an error.
  cli_option needs(cli_option other) const;
  /// True once `command_line::parse` has seen this option on the command line.
  bool was_given() const;

 private:
  friend class command_line;
  explicit cli_option(CLI::Option* option) : option_(option) {}
  CLI::Option* option_;
};

/// What `command_line::parse` does with the help text or error message of a
/// command line that ends the program.
enum class parse_output {
  print,     ///< help on stdout, errors on stderr, as CLI11_PARSE does
  suppress,  ///< nothing (an MPI rank other than the one that reports)
};

/// A program's command line: options bound to variables, which `parse`
/// assigns. Names follow CLI11: "--tokens", "-n,--requests", and a flag
/// named "!--no-progress" sets its variable to false. --help lists every
/// option with its description.
///
/// The integer overloads take the fundamental types, so that std::int64_t,
/// std::size_t and std::uint64_t each find theirs on every data model.
class command_line {
 public:
  /// `description` opens --help.
  explicit command_line(const std::string& description);
  ~command_line();
  command_line(const command_line&) = delete;
  command_line& operator=(const command_line&) = delete;

  /// Options added after this call show their default in --help: the
  /// variable's value when the option is added.
  void show_defaults();

  /// Adds an option whose argument `parse` assigns to `value`.
  cli_option add_option(const std::string& names, std::string& value, const std::string& description);
  cli_option add_option(const std::string& names, long& value, const std::string& description);
  cli_option add_option(const std::string& names, long long& value, const std::string& description);
  cli_option add_option(const std::string& names, unsigned long& value, const std::string& description);
  cli_option add_option(const std::string& names, unsigned long long& value, const std::string& description);
  cli_option add_option(const std::string& names, float& value, const std::string& description);
  cli_option add_option(const std::string& names, double& value, const std::string& description);
  /// Adds a repeatable option: each argument is one more element of `values`.
  cli_option add_option(const std::string& names, std::vector<std::string>& values, const std::string& description);
  cli_option add_option(const std::string& names, std::vector<std::size_t>& values, const std::string& description);
  /// Adds a flag that sets `value` to true when given (false for a "!" name).
  cli_option add_flag(const std::string& names, bool& value, const std::string& description);

  /// Parses the arguments into the options' variables and returns nothing
  /// when the program should go on. After --help or a bad command line,
  /// prints what CLI11_PARSE prints (unless `output` is suppress) and returns
  /// the code the program should exit with, CLI11_PARSE's.
  std::optional<int> parse(int argc, char** argv, parse_output output = parse_output::print);

 private:
  std::unique_ptr<CLI::App> app_;
};

}  // namespace llmkit_examples
