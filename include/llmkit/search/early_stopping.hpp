// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/early_stopping.hpp
/// When beam search stops before its token budget (`early_stopping`), for
/// the stand-alone `beam_search` and the serving engine's beam requests.

#include <cstdint>
#include <string_view>

namespace llmkit::search {

/// When beam search stops before the token budget.
enum class early_stopping : std::uint8_t {
  when_n_done,     ///< as soon as beam_width hypotheses are finished (Hugging Face early_stopping=True)
  when_no_better,  ///< when beam_width are finished and no live beam can beat the worst of them, whatever
                   ///< its future tokens (an exact bound: log-probabilities only decrease)
  never,           ///< only at the token budget or when no live beam is left
};

/// Printable name ("when_n_done", "when_no_better", "never").
constexpr std::string_view early_stopping_name(early_stopping e) noexcept {
  switch (e) {
    case early_stopping::when_n_done: return "when_n_done";
    case early_stopping::when_no_better: return "when_no_better";
    case early_stopping::never: return "never";
  }
  return "?";
}

}  // namespace llmkit::search
