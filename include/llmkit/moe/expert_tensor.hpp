// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/moe/expert_tensor.hpp
/// A layer's experts' weights of one projection: a 3-D tensor
/// `[n_expert, rows, cols]` held as n_expert weight matrices `[rows, cols]`
/// of one storage type (model/weights.hpp), so that every dense product
/// runs on one expert's slice. GGUF stores such a tensor (`ffn_gate_exps`,
/// `ffn_up_exps`, `ffn_down_exps`) with dims `{cols, rows, n_expert}`,
/// expert after expert; `expert_slice` names one expert's 2-D part of it,
/// which `weight_matrix::in_place` can use where it lies.

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/weights.hpp"

namespace llmkit::moe {

/// Expert e's `[rows, cols]` part of a 3-D GGUF tensor `[n_expert, rows,
/// cols]` (dims {cols, rows, n_expert}): a 2-D tensor over the same bytes.
/// @throws llmkit::error naming the tensor when it is not 3-D, its rows are
/// not whole blocks, or e is out of range.
inline model::gguf_tensor expert_slice(const model::gguf_tensor& t, std::size_t e) {
  LLMKIT_CHECK(t.n_dims == 3, "moe::expert_slice: tensor '", t.name, "' has ", t.n_dims,
               " dims, an expert tensor has 3 {cols, rows, n_expert}");
  const std::size_t n_expert = static_cast<std::size_t>(t.dims[2]);
  LLMKIT_CHECK(e < n_expert, "moe::expert_slice: expert ", e, " of tensor '", t.name, "' with ", n_expert,
               " experts");
  const std::size_t block = model::ggml_block_elements(t.type);
  LLMKIT_CHECK(t.dims[0] % block == 0, "moe::expert_slice: tensor '", t.name, "' has rows of ", t.dims[0],
               " values, not whole blocks of ", block);
  model::gguf_tensor s = t;
  s.n_dims = 2;
  s.dims = {t.dims[0], t.dims[1], 1, 1};
  s.n_elements = t.dims[0] * t.dims[1];
  s.n_bytes = t.n_bytes / n_expert;
  s.offset = t.offset + e * s.n_bytes;
  s.data = t.data + e * s.n_bytes;
  return s;
}

/// `[n_expert, rows, cols]` expert weights: one weight_matrix per expert,
/// all of one storage type and shape.
class expert_tensor {
 public:
  expert_tensor() = default;

  /// n_expert zero matrices `[rows, cols]` of storage `type`.
  /// @throws llmkit::error for n_expert = 0, or what weight_matrix's constructor throws.
  expert_tensor(model::weight_type type, std::size_t n_expert, std::size_t rows, std::size_t cols) {
    LLMKIT_CHECK(n_expert >= 1, "moe::expert_tensor: n_expert = 0");
    experts_.reserve(n_expert);
    for (std::size_t e = 0; e < n_expert; ++e) experts_.emplace_back(type, rows, cols);
  }

  /// The experts' matrices, taken over.
  /// @throws llmkit::error when there are none, or they differ in type or shape (naming the first that does).
  explicit expert_tensor(std::vector<model::weight_matrix> experts) : experts_(std::move(experts)) {
    LLMKIT_CHECK(!experts_.empty(), "moe::expert_tensor: no experts");
    const model::weight_matrix& first = experts_.front();
    for (std::size_t e = 1; e < experts_.size(); ++e) {
      const model::weight_matrix& m = experts_[e];
      LLMKIT_CHECK(m.type() == first.type() && m.rows() == first.rows() && m.cols() == first.cols(),
                   "moe::expert_tensor: expert ", e, " is ", model::weight_type_name(m.type()), " [", m.rows(), ", ",
                   m.cols(), "], expert 0 is ", model::weight_type_name(first.type()), " [", first.rows(), ", ",
                   first.cols(), "]");
    }
  }

  std::size_t n_expert() const noexcept { return experts_.size(); }
  std::size_t rows() const noexcept { return experts_.empty() ? 0 : experts_.front().rows(); }
  std::size_t cols() const noexcept { return experts_.empty() ? 0 : experts_.front().cols(); }
  model::weight_type type() const noexcept { return experts_.empty() ? model::weight_type::f32 : experts_.front().type(); }
  /// Bytes of one expert (what a product over it reads once).
  std::size_t expert_bytes() const noexcept { return experts_.empty() ? 0 : experts_.front().bytes(); }
  /// Bytes of all experts.
  std::size_t bytes() const noexcept { return expert_bytes() * n_expert(); }

  /// Expert e's `[rows, cols]` matrix. @pre e < n_expert()
  const model::weight_matrix& expert(std::size_t e) const noexcept { return experts_[e]; }
  /// Expert e's matrix, to fill (set_row, copy_from). @pre e < n_expert()
  model::weight_matrix& expert(std::size_t e) noexcept { return experts_[e]; }

 private:
  std::vector<model::weight_matrix> experts_;
};

}  // namespace llmkit::moe
