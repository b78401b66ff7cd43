# SPDX-License-Identifier: MIT
# test_chat_template belongs to the model family (ctest -L model).
list(APPEND llmkit_test_labels model)
