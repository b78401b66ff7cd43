// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/bind_job.hpp
/// What every attention call does first with its kernel job (`decode_job`,
/// `prefill_job`): point it at the call's parameters, the cache's K/V
/// chunks and the mask.

#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"

namespace llmkit::attention::detail {

/// Sets `job.params` to `p`, `job.source` to the chunks of `cache` and
/// `job.mask` to `mask`'s type-erased reference. `p`, `cache` and `mask`
/// must outlive the job's tasks.
template <class Job, class Params, class Cache, class Mask>
void bind_job(Job& job, const Params& p, const Cache& cache, const Mask& mask) {
  job.params = &p;
  job.source = make_chunk_source(cache);
  job.mask = make_mask_ref(mask);
}

}  // namespace llmkit::attention::detail
