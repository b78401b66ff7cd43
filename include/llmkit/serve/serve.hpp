// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/serve.hpp
/// The serving engine: requests, events, options, statistics, the
/// incremental text stream, the engine's token draw, speculative decoding
/// (request settings, draft models), and the engine itself.

#include "llmkit/serve/draft.hpp"
#include "llmkit/serve/engine.hpp"
#include "llmkit/serve/engine_cache.hpp"
#include "llmkit/serve/model_draft.hpp"
#include "llmkit/serve/options.hpp"
#include "llmkit/serve/request.hpp"
#include "llmkit/serve/sample.hpp"
#include "llmkit/serve/stats.hpp"
#include "llmkit/serve/text_stream.hpp"
