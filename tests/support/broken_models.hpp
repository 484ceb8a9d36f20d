// Models that break the Model contract on purpose, to test the decoder's checks, and one at its edge (-inf).
#pragma once

#include <limits>
#include <utility>
#include <vector>

#include <specdec/specdec.hpp>

namespace specdec::test {

/// Wraps a ToyModel and corrupts its output: wrong number of rows or columns, a NaN or +inf value, or a last
/// row of -inf alone (every token masked out).
class BrokenModel {
 public:
  enum class Fault { none, extra_row, missing_column, nan, infinity, all_masked };
  BrokenModel(ToyModelConfig config, Fault fault, std::size_t healthy_calls = 0)
      : inner_(config), fault_(fault), healthy_calls_(healthy_calls) {}

  std::size_t vocab_size() const { return inner_.vocab_size(); }
  std::size_t context_size() const { return inner_.context_size(); }
  void truncate(std::size_t n) { inner_.truncate(n); }
  const Logits& forward(std::span<const Token> tokens) {
    logits_ = inner_.forward(tokens);
    if (calls_++ < healthy_calls_) return logits_;
    switch (fault_) {
      case Fault::none: break;
      case Fault::extra_row: logits_.conservativeResize(logits_.rows() + 1, logits_.cols()); logits_.bottomRows(1).setZero(); break;
      case Fault::missing_column: logits_.conservativeResize(logits_.rows(), logits_.cols() - 1); break;
      case Fault::nan: logits_(logits_.rows() - 1, 3) = std::numeric_limits<float>::quiet_NaN(); break;
      case Fault::infinity: logits_(0, 1) = std::numeric_limits<float>::infinity(); break;
      case Fault::all_masked: logits_.bottomRows(1).setConstant(-std::numeric_limits<float>::infinity()); break;
    }
    return logits_;
  }

 private:
  ToyModel inner_;
  Fault fault_;
  std::size_t healthy_calls_;
  std::size_t calls_ = 0;
  Logits logits_;
};
static_assert(Model<BrokenModel>);

/// A ToyModel with some tokens masked out: their logits are -inf in every row, which the Model contract allows.
class MaskedModel {
 public:
  MaskedModel(ToyModelConfig config, std::vector<Token> masked) : inner_(config), masked_(std::move(masked)) {}

  std::size_t vocab_size() const { return inner_.vocab_size(); }
  std::size_t context_size() const { return inner_.context_size(); }
  std::uint64_t revision() const { return inner_.revision(); }
  void truncate(std::size_t n) { inner_.truncate(n); }
  const Logits& forward(std::span<const Token> tokens) {
    logits_ = inner_.forward(tokens);
    for (const Token t : masked_) logits_.col(t).setConstant(-std::numeric_limits<float>::infinity());
    return logits_;
  }

 private:
  ToyModel inner_;
  std::vector<Token> masked_;
  Logits logits_;
};
static_assert(Model<MaskedModel>);

/// Not a model: it lacks truncate().
struct NotAModel {
  std::size_t vocab_size() const { return 4; }
  std::size_t context_size() const { return 0; }
  const Logits& forward(std::span<const Token>);
};
static_assert(!Model<NotAModel>);

}  // namespace specdec::test
