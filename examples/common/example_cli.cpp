// SPDX-License-Identifier: MIT
/// @file examples/common/example_cli.cpp
/// examples/example_cli.hpp's `command_line` and `cli_option` on CLI11: the
/// one translation unit of the example programs that compiles CLI11.

#include "../example_cli.hpp"

#include <CLI/CLI.hpp>

namespace llmkit_examples {

cli_option cli_option::count_at_least(long long min, const std::string& why) const {
  option_->check(CLI::Validator(
      [min, why](std::string& value) -> std::string {
        long long v = 0;
        if (!CLI::detail::lexical_cast(value, v)) return "got '" + value + "': not an integer";
        if (v < min) return "got " + value + ": " + why + " (give " + std::to_string(min) + " or more)";
        return {};
      },
      "INT>=" + std::to_string(min)));
  return *this;
}

cli_option cli_option::in_range(int min, int max) const {
  option_->check(CLI::Range(min, max));
  return *this;
}

cli_option cli_option::in_range(float min, float max) const {
  option_->check(CLI::Range(min, max));
  return *this;
}

cli_option cli_option::in_range(double min, double max) const {
  option_->check(CLI::Range(min, max));
  return *this;
}

cli_option cli_option::non_negative() const {
  option_->check(CLI::NonNegativeNumber);
  return *this;
}

cli_option cli_option::one_of(std::initializer_list<std::string> allowed) const {
  option_->check(CLI::IsMember(std::vector<std::string>(allowed)));
  return *this;
}

cli_option cli_option::one_of(std::initializer_list<int> allowed) const {
  option_->check(CLI::IsMember(std::vector<int>(allowed)));
  return *this;
}

cli_option cli_option::one_of(std::span<const std::string_view> allowed) const {
  option_->check(CLI::IsMember(std::vector<std::string>(allowed.begin(), allowed.end())));
  return *this;
}

cli_option cli_option::delimiter(char separator) const {
  option_->delimiter(separator);
  return *this;
}

cli_option cli_option::excludes(cli_option other) const {
  option_->excludes(other.option_);
  return *this;
}

cli_option cli_option::needs(cli_option other) const {
  option_->needs(other.option_);
  return *this;
}

bool cli_option::was_given() const { return !option_->empty(); }

command_line::command_line(const std::string& description) : app_(std::make_unique<CLI::App>(description)) {}

command_line::~command_line() = default;

void command_line::show_defaults() { app_->option_defaults()->always_capture_default(); }

cli_option command_line::add_option(const std::string& names, std::string& value, const std::string& description) {
  return cli_option(app_->add_option(names, value, description));
}
cli_option command_line::add_option(const std::string& names, long& value, const std::string& description) {
  return cli_option(app_->add_option(names, value, description));
}
cli_option command_line::add_option(const std::string& names, long long& value, const std::string& description) {
  return cli_option(app_->add_option(names, value, description));
}
cli_option command_line::add_option(const std::string& names, unsigned long& value, const std::string& description) {
  return cli_option(app_->add_option(names, value, description));
}
cli_option command_line::add_option(const std::string& names, unsigned long long& value,
                                    const std::string& description) {
  return cli_option(app_->add_option(names, value, description));
}
cli_option command_line::add_option(const std::string& names, float& value, const std::string& description) {
  return cli_option(app_->add_option(names, value, description));
}
cli_option command_line::add_option(const std::string& names, double& value, const std::string& description) {
  return cli_option(app_->add_option(names, value, description));
}
cli_option command_line::add_option(const std::string& names, std::vector<std::string>& values,
                                    const std::string& description) {
  return cli_option(app_->add_option(names, values, description));
}
cli_option command_line::add_option(const std::string& names, std::vector<std::size_t>& values,
                                    const std::string& description) {
  return cli_option(app_->add_option(names, values, description));
}

cli_option command_line::add_flag(const std::string& names, bool& value, const std::string& description) {
  return cli_option(app_->add_flag(names, value, description));
}

std::optional<int> command_line::parse(int argc, char** argv, parse_output output) {
  try {
    app_->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return output == parse_output::print ? app_->exit(e) : e.get_exit_code();
  }
  return std::nullopt;
}

}  // namespace llmkit_examples
