// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/config.hpp
/// How llmkit's non-template functions are compiled.
///
/// By default llmkit is header-only: every header defines its functions
/// inline. With `LLMKIT_SEPARATE_COMPILATION` defined in every translation
/// unit of a program, the headers only declare the large non-template
/// functions (the GGUF reader, weight loading, the tokenizers, the chat
/// templates, the run-time sampling chain, ...) and exactly one source file
/// of the program includes `<llmkit/src.hpp>`, which defines them; the other
/// files then do not compile them again.
///
/// The definitions live in `impl/*.ipp` files next to their headers; each
/// header includes its own at its end unless `LLMKIT_SEPARATE_COMPILATION`
/// is defined.

/// Marks the definition of a function that a header declares and an
/// `impl/*.ipp` file defines: `inline` in header-only mode, nothing when
/// `<llmkit/src.hpp>` compiles it once.
#if defined(LLMKIT_SEPARATE_COMPILATION)
#define LLMKIT_DECL
#else
#define LLMKIT_DECL inline
#endif
