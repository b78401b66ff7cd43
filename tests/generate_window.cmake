# SPDX-License-Identifier: MIT
# llmkit-generate on a model with local layers: the default (--kv-window
# ring) generates the same tokens as --kv-window full, and says which cache
# it used. Run as
#   cmake -DGENERATE=<llmkit-generate> -DMODEL=<gguf> -DLAYOUT=<expected KV line> -P generate_window.cmake
# A prompt of ~80 tokens (prefilled in one chunk) and 48 generated tokens
# take the context far past the models' window of 8.
set(_prompt "Once upon a time there was a little girl who lived in a village near the forest and she liked to walk")
foreach(_mode IN ITEMS ring full)
  execute_process(
    COMMAND "${GENERATE}" --model "${MODEL}" --prompt "${_prompt}" --tokens 48 --temperature 0 --threads 1
            --kv-window ${_mode}
    OUTPUT_VARIABLE _out_${_mode} ERROR_VARIABLE _err_${_mode} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "llmkit-generate --kv-window ${_mode} failed (${_rc}):\n${_err_${_mode}}")
  endif()
endforeach()
if(NOT _err_ring MATCHES "KV: ${LAYOUT}")
  message(FATAL_ERROR "--kv-window ring did not use '${LAYOUT}':\n${_err_ring}")
endif()
if(NOT _err_full MATCHES "KV: every position in every layer")
  message(FATAL_ERROR "--kv-window full did not keep every position:\n${_err_full}")
endif()
if(NOT _err_ring MATCHES "generated: 48 tokens")
  message(FATAL_ERROR "expected 48 generated tokens:\n${_err_ring}")
endif()
if(NOT _out_ring STREQUAL _out_full)
  message(FATAL_ERROR "ring and full caches generated different text:\nring: ${_out_ring}\nfull: ${_out_full}")
endif()
message(STATUS "ring == full: ${_out_ring}")
