# SPDX-License-Identifier: MIT
# The beam-search engine test runs a two-thread executor: the tsan preset runs it too.
list(APPEND llmkit_test_labels threads)
