// SPDX-License-Identifier: MIT
// The model's product kernels, compiled once for all of llmkit's in-tree
// binaries (see include/llmkit/model/kernels.hpp).
#include <llmkit/model/kernels.hpp>

LLMKIT_MODEL_INSTANTIATE_KERNELS()
