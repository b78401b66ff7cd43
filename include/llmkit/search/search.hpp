// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/search.hpp  Every public header of the search module.

#include "llmkit/core/stop.hpp"
#include "llmkit/search/beam_search.hpp"
#include "llmkit/search/drafter.hpp"
#include "llmkit/search/early_stopping.hpp"
#include "llmkit/search/generate.hpp"
#include "llmkit/search/model_drafter.hpp"
#include "llmkit/search/ngram_drafter.hpp"
#include "llmkit/search/sequence_cache.hpp"
#include "llmkit/search/speculative.hpp"
