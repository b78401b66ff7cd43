// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/sampling.hpp  Every public header of the sampling module.

#include "llmkit/sampling/banned_sequences.hpp"
#include "llmkit/sampling/batch.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/categorical.hpp"
#include "llmkit/sampling/chain.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/greedy.hpp"
#include "llmkit/sampling/logit_bias.hpp"
#include "llmkit/sampling/logprobs.hpp"
#include "llmkit/sampling/min_length.hpp"
#include "llmkit/sampling/min_p.hpp"
#include "llmkit/sampling/no_repeat_ngram.hpp"
#include "llmkit/sampling/penalties.hpp"
#include "llmkit/sampling/rng.hpp"
#include "llmkit/sampling/runtime_chain.hpp"
#include "llmkit/sampling/temperature.hpp"
#include "llmkit/sampling/top_k.hpp"
#include "llmkit/sampling/top_p.hpp"
#include "llmkit/sampling/typical_p.hpp"
