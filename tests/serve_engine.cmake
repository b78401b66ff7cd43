# SPDX-License-Identifier: MIT
# The engine test runs requests from several threads (clients, the engine's
# step thread, a two-thread executor): the tsan preset runs it too.
list(APPEND llmkit_test_labels threads)
