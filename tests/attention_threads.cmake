# SPDX-License-Identifier: MIT
# Concurrent decode calls, run under ThreadSanitizer by the tsan preset: one
# head dim and the header kernels (not the shared kernel library), so the
# TSan build compiles one small translation unit.
target_compile_definitions(${llmkit_test_target} PRIVATE LLMKIT_ATTENTION_HEAD_DIMS=64)
set(llmkit_test_link llmkit_inTreeFlags)
list(APPEND llmkit_test_labels threads)
