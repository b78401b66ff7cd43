// SPDX-License-Identifier: MIT
// A first program against the installed package: includes the umbrella
// header and runs a kernel with the default (compile-time) arch.
#include <llmkit/llmkit.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  const float d = llmkit::simd::dot(std::span<const float>(a), std::span<const float>(b));
  std::printf("llmkit %s, arch %s, dot = %g\n", llmkit::version_string,
              llmkit::simd::arch_name<llmkit::simd::default_arch>(), double(d));
  return d == 200.0f ? 0 : 1;
}
