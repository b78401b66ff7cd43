// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/llmkit.hpp  Umbrella header: every public header of llmkit.

#include "llmkit/version.hpp"

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dispatch.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/views.hpp"

#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/dot.hpp"
