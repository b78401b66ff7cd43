// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/version.hpp  The library's version.
namespace llmkit {
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
/// "major.minor.patch"
inline constexpr const char* version_string = "0.1.0";
}  // namespace llmkit
