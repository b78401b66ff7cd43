// SPDX-License-Identifier: MIT
// The attention kernels for int8 storage, compiled once for all of llmkit's
// in-tree binaries (see include/llmkit/attention/kernels.hpp).
#include <llmkit/attention/kernels.hpp>

LLMKIT_ATTENTION_INSTANTIATE_KERNELS(std::int8_t)
