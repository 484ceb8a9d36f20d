// specdec/tensor.hpp — the token and logits types every other header speaks.
// Entry point: specdec::Token, specdec::Logits. Read next: model.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "specdec/detail/eigen_core.hpp"

namespace specdec {

/// A token id. Valid ids are 0 .. vocab_size() - 1.
using Token = std::int32_t;

/// Vocabularies hold fewer tokens than this: every id must be a Token.
inline constexpr std::size_t max_vocab_size = std::size_t{1} << 31;

/// Logits of a forward call: one row per appended position, one column per vocabulary entry.
/// Row-major so that each position's row is contiguous.
using Logits = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;  // [positions, vocab]

}  // namespace specdec
