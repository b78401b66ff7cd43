# SPDX-License-Identifier: MIT
# The core tests include the thread pool's: cheap to build, so the tsan
# preset runs them too. They call no attention kernel (no kernel library).
set(llmkit_test_link llmkit_inTreeFlags)
list(APPEND llmkit_test_labels threads)
