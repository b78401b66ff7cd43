// SPDX-License-Identifier: MIT
// The attention kernels for f32 storage, compiled once for all of llmkit's
// in-tree binaries (see include/llmkit/attention/kernels.hpp).
#include <llmkit/attention/kernels.hpp>

LLMKIT_ATTENTION_INSTANTIATE_KERNELS(float)
