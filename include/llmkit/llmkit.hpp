// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/llmkit.hpp  Umbrella header: every public header of llmkit.

#include "llmkit/version.hpp"

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dispatch.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/stop.hpp"
#include "llmkit/core/views.hpp"

#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/dot.hpp"
#include "llmkit/simd/simd.hpp"

#include "llmkit/kv/block_pool.hpp"
#include "llmkit/kv/cache_usage.hpp"
#include "llmkit/kv/contiguous_cache.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/kv/paged_cache.hpp"
#include "llmkit/kv/prefix_cache.hpp"
#include "llmkit/kv/sliding_window_cache.hpp"
#include "llmkit/kv/storage.hpp"

#include "llmkit/attention/decode.hpp"
#include "llmkit/attention/head_dims.hpp"
#include "llmkit/attention/mask.hpp"
#include "llmkit/attention/prefill.hpp"

#include "llmkit/pack/best_fit.hpp"
#include "llmkit/pack/first_fit.hpp"
#include "llmkit/pack/length_distribution.hpp"
#include "llmkit/pack/next_fit.hpp"
#include "llmkit/pack/packed_batch.hpp"
#include "llmkit/pack/packers.hpp"
#include "llmkit/pack/packing.hpp"
#include "llmkit/pack/padded_batch.hpp"
#include "llmkit/pack/prefill.hpp"

#include "llmkit/sampling/sampling.hpp"

#include "llmkit/search/search.hpp"
#include "llmkit/search/self_draft.hpp"

#include "llmkit/sched/cost_model.hpp"
#include "llmkit/sched/disaggregation.hpp"
#include "llmkit/sched/policy.hpp"
#include "llmkit/sched/prefill_packer.hpp"
#include "llmkit/sched/request.hpp"
#include "llmkit/sched/scheduler.hpp"
#include "llmkit/sched/simulator.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/sched/step_plan.hpp"
#include "llmkit/sched/trace.hpp"

#include "llmkit/model/architecture.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/gguf_writer.hpp"
#include "llmkit/model/chat_template.hpp"
#include "llmkit/model/harmony_stream.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/model/llama.hpp"
#include "llmkit/model/synthetic.hpp"
#include "llmkit/model/tokenizer.hpp"
#include "llmkit/model/weights.hpp"
#include "llmkit/serve/serve.hpp"

#include "llmkit/eval/logit_base.hpp"
#include "llmkit/eval/perplexity.hpp"

#include "llmkit/moe/routed_ffn.hpp"
#include "llmkit/moe/router.hpp"
