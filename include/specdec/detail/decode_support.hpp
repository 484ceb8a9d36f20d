// specdec/detail/decode_support.hpp — pieces the decoder loops share: argument checks, checked and timed
// model calls, context tracking for rollback and prefix reuse, and token emission with stop rules.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/model.hpp"
#include "specdec/sampling.hpp"
#include "specdec/stats.hpp"

namespace specdec::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Checks what generate() is given: a non-empty prompt and stop tokens inside the vocabulary.
inline void check_request(std::span<const Token> prompt, const GenerateOptions& options, std::size_t vocab) {
  if (prompt.empty()) fail("prompt is empty: generation needs at least one token");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || static_cast<std::size_t>(prompt[i]) >= vocab)
      fail("prompt token ", i, " is ", prompt[i], ", outside the vocabulary of ", vocab, " tokens");
  for (Token t : options.stop_tokens)
    if (t < 0 || static_cast<std::size_t>(t) >= vocab)
      fail("stop token ", t, " is outside the vocabulary of ", vocab, " tokens");
  if (!(options.draft_p_min >= 0.0f && options.draft_p_min <= 1.0f))
    fail("draft_p_min must be in [0, 1], got ", exact(options.draft_p_min));
}

/// Throws unless `token`, which `source` gave (an acceptance policy's proposal or choice), is inside the
/// vocabulary: the models would otherwise be fed an id that none of them can hold, and blamed for it.
inline Token checked_token(Token token, std::size_t vocab, const char* source) {
  if (token < 0 || static_cast<std::size_t>(token) >= vocab)
    fail(source, " returned token ", token, ", outside the vocabulary of ", vocab, " tokens");
  return token;
}

/// Whether `a` and `b` are one model object: the same object, or one a base-class part of the other. A bare
/// address comparison would also call a distinct object at offset 0 inside the other (a draft that is a
/// target's first member) the same one. A private or ambiguous base, which no pointer conversion reaches, is
/// compared by address.
template <class A, class B>
bool same_object(const A& a, const B& b) {
  const void* const pa = std::addressof(a);
  const void* const pb = std::addressof(b);
  if constexpr (std::is_same_v<A, B>) return pa == pb;
  else if constexpr (std::is_convertible_v<const B*, const A*>) return pa == static_cast<const A*>(std::addressof(b));
  else if constexpr (std::is_convertible_v<const A*, const B*>) return static_cast<const B*>(std::addressof(a)) == pb;
  else if constexpr (std::is_base_of_v<A, B> || std::is_base_of_v<B, A>) return pa == pb;
  else return false;
}

/// Throws when the prompt alone is longer than the target's max_context (HasMaxContext), naming both, before
/// any forward call (the model's own overflow error would speak of its cache, not of the prompt).
template <class M>
void check_prompt_fits(const M& target, std::size_t prompt_tokens) {
  if constexpr (HasMaxContext<M>)
    if (prompt_tokens > static_cast<std::size_t>(target.max_context()))
      fail("prompt of ", prompt_tokens, " tokens exceeds the target's max_context of ", target.max_context(), " positions");
}

/// A model together with the tokens the decoder has fed it, so that rollback and prefix reuse are exact.
template <Model M>
class TrackedModel {
 public:
  TrackedModel(M& model, const char* role) : model_(model), role_(role) {}

  M& model() { return model_; }
  std::size_t vocab_size() const { return static_cast<std::size_t>(model_.vocab_size()); }

  /// Rolls the model back to the longest prefix of `sequence` it holds, keeping at most `limit` tokens.
  /// Returns how many tokens it kept. If someone else changed the model's context (its size differs from what
  /// was fed, or its revision() from the one after the last call made here), it starts over.
  std::size_t sync(std::span<const Token> sequence, std::size_t limit) {
    if (static_cast<std::size_t>(model_.context_size()) != fed_.size() || !unchanged()) fed_.clear();
    const auto mismatch = std::mismatch(fed_.begin(), fed_.end(), sequence.begin(), sequence.end());
    const auto common = std::min<std::size_t>(static_cast<std::size_t>(mismatch.first - fed_.begin()), limit);
    fed_.resize(common);
    model_.truncate(common);
    note_revision();
    return common;
  }

  /// Feeds tokens whose logits are not needed (the prompt): through the model's optional append(), which
  /// skips the output head, or else through forward().
  void append(std::span<const Token> tokens, double& seconds, std::size_t& calls) {
    if constexpr (requires { model_.append(tokens); }) {
      check_fits(tokens.size());
      const auto start = Clock::now();
      model_.append(tokens);
      seconds += seconds_since(start);
      ++calls;
      fed_.insert(fed_.end(), tokens.begin(), tokens.end());
      note_revision();
    } else {
      forward(tokens, seconds, calls);
    }
  }

  /// One checked, timed forward call: logits must be [tokens.size(), vocab], numbers or -inf (a token masked
  /// out, as transform_logits takes it), with at least one number in every row.
  const Logits& forward(std::span<const Token> tokens, double& seconds, std::size_t& calls) {
    check_fits(tokens.size());
    const auto start = Clock::now();
    const Logits& logits = held(model_.forward(tokens));
    seconds += seconds_since(start);
    ++calls;
    fed_.insert(fed_.end(), tokens.begin(), tokens.end());
    note_revision();
    const auto rows = static_cast<std::size_t>(logits.rows()), cols = static_cast<std::size_t>(logits.cols());
    if (rows != tokens.size() || cols != vocab_size())
      fail(role_, " returned logits of shape [", rows, ", ", cols, "], expected [", tokens.size(), ", ", vocab_size(), "]");
    const std::span<const float> values(logits.data(), rows * cols);
    if (first_bits_where(values, not_finite_bits)) check_masked_rows(values, cols);  // a model that masks tokens
    return logits;
  }

 private:
  /// The check of forward()'s logits where some are not numbers: -inf (a masked token) passes, NaN and +inf do
  /// not, nor a row of -inf alone. One pass over each row (and a search for the first bad value, if any).
  void check_masked_rows(std::span<const float> values, std::size_t cols) const {
    for (std::size_t r = 0; r * cols < values.size(); ++r) {
      const std::span<const float> row = values.subspan(r * cols, cols);
      std::uint32_t bad = 0, masked = 1;
      for (const float v : row) {
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        bad |= static_cast<std::uint32_t>(nan_or_plus_inf_bits(bits));
        masked &= static_cast<std::uint32_t>(bits == 0xff800000u);
      }
      if (bad) {
        const auto at = *first_bits_where(row, nan_or_plus_inf_bits);
        fail(role_, " returned a non-finite logit (", row[at], ") at row ", r, ", column ", at);
      }
      if (masked) fail(role_, " returned -inf for every token at row ", r, ": no token left to choose");
    }
  }

  /// The logits a forward call returned, as a reference that stays valid until the next call: the model's own
  /// Logits where it returns a reference to them (the shipped models do), else a copy kept here. The Model
  /// concept allows anything that converts to const Logits& (a Logits by value, a column-major matrix), and a
  /// reference bound to such a temporary would dangle as soon as this call returned.
  template <class Result>
  const Logits& held(Result&& result) {
    if constexpr (std::is_lvalue_reference_v<Result&&> && std::is_same_v<std::remove_cvref_t<Result>, Logits>) {
      return result;
    } else {
      held_ = std::forward<Result>(result);
      return held_;
    }
  }

  /// Throws before a call that would take a model past the max_context() it declares (HasMaxContext), where a
  /// model would throw its own error (a request for more tokens than its context holds), or, where its own
  /// checks are missing or wrong, compute past its cache. The decoder's rounds stay within it otherwise.
  void check_fits(std::size_t tokens) const {
    if constexpr (HasMaxContext<M>) {
      const auto held_tokens = static_cast<std::size_t>(model_.context_size());
      const auto limit = static_cast<std::size_t>(model_.max_context());
      if (held_tokens > limit || tokens > limit - held_tokens)
        fail(role_, " holds ", held_tokens, " tokens: ", tokens, " more would pass its max_context of ", limit);
    }
  }

  void note_revision() {
    if constexpr (HasRevision<M>) revision_ = static_cast<std::uint64_t>(model_.revision());
  }
  bool unchanged() const {
    if constexpr (HasRevision<M>) return static_cast<std::uint64_t>(model_.revision()) == revision_;
    return true;
  }

  M& model_;
  const char* role_;
  std::vector<Token> fed_;  // the tokens the model holds, as far as the decoder knows
  std::uint64_t revision_ = 0;  // the model's revision() after the last call made here (HasRevision models)
  Logits held_;  // the last forward's logits, where the model returned them by value (see held())
};

/// Appends final tokens to the output, fires on_token and applies the stop rules.
class Emitter {
 public:
  Emitter(const GenerateOptions& options, Generation& out, std::vector<Token>& sequence)
      : options_(options), out_(out), sequence_(sequence) {}

  /// Emits one token; returns true when generation must end (out.stop_reason says why).
  bool emit(Token token) {
    sequence_.push_back(token);
    out_.tokens.push_back(token);
    ++out_.stats.generated_tokens;
    const bool keep_going = !options_.on_token || options_.on_token(token);
    if (std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(), token) != options_.stop_tokens.end())
      return finish(StopReason::stop_token);
    if (!keep_going) return finish(StopReason::callback);
    if (out_.tokens.size() >= options_.max_new_tokens) return finish(StopReason::max_tokens);
    return false;
  }

  std::size_t remaining() const { return options_.max_new_tokens - out_.tokens.size(); }

 private:
  bool finish(StopReason reason) {
    out_.stop_reason = reason;
    return true;
  }
  const GenerateOptions& options_;
  Generation& out_;
  std::vector<Token>& sequence_;
};

}  // namespace specdec::detail
