# SPDX-License-Identifier: MIT
# test_attention_decode also instantiates the AVX2 kernels itself: as for
# the kernel library, no use-after-scope checks on their SIMD temporaries
# under AddressSanitizer (they multiply its compile time several-fold).
if(CMAKE_CXX_FLAGS MATCHES "sanitize=[a-z,]*address")
  target_compile_options(${llmkit_test_target} PRIVATE -fno-sanitize-address-use-after-scope)
endif()
