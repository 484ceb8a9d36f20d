// specdec/model.hpp — the Model concept: what the decoder needs from a draft or target network.
// Entry point: specdec::Model. Read next: decoder.hpp (who calls it), kv_cache.hpp (how to implement truncate).
#pragma once

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "specdec/tensor.hpp"

namespace specdec {

/// A causal language model that keeps its own context (its KV cache).
template <class M>
concept Model = requires(M& m, const M& cm, std::span<const Token> t, std::size_t n) {
  // The decoder checks that draft and target share one vocabulary and validates token ids against it.
  { cm.vocab_size() } -> std::convertible_to<std::size_t>;
  // Tokens the model holds; the decoder reuses the common prefix of a new prompt and rolls back rejected drafts.
  { cm.context_size() } -> std::convertible_to<std::size_t>;
  // Appends `t` to the context and returns logits for each appended position: [t.size(), vocab_size()].
  // The target scores all draft proposals of a round in one such call.
  { m.forward(t) } -> std::convertible_to<const Logits&>;
  // Keeps the first n tokens and drops the rest: the rollback after rejected drafts.
  m.truncate(n);
};

/// Optional for a draft: how many tokens, at most, it advises proposing from its current state (asked once per
/// round, right after the forward call that gave the round's first proposal). A draft that knows when it is
/// guessing (a prompt-lookup match of one token) can keep the round short there and long where it is sure.
/// 0 ends the round's drafting. Speed depends on it, the output's distribution never: greedy and CoupledSampling
/// output not at all, RejectionSampling's tokens for a given seed do (see GenerateOptions::seed).
template <class M>
concept HasDraftBudget = requires(const M& cm) {
  { cm.draft_budget() } -> std::convertible_to<std::size_t>;
};

/// Optional for any model: a number that changes whenever the context does (every forward, append and
/// truncate). A decoder reuses what a model already holds between generate() calls; with revision() it notices
/// when something else used the model meanwhile, even if that left it holding as many tokens as before. A model
/// without it is checked by context_size() alone: truncate(0) it after using it elsewhere. Take each new
/// revision from next_revision(): a counter of the model's own would let a copy, changed as often and then
/// assigned over it, pass for the model itself.
template <class M>
concept HasRevision = requires(const M& cm) {
  { cm.revision() } -> std::convertible_to<std::uint64_t>;
};

/// A revision number no model in this process has had before (see HasRevision); thread-safe.
inline std::uint64_t next_revision() {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

/// Optional for any model: how many tokens its context holds at most. The decoder keeps each round within it
/// (fewer proposals near the end, none when only the target's next token fits), so speculative decoding runs
/// wherever plain decoding of the same target does. Without it, a round may ask for up to k positions more
/// than plain decoding would, and a model that cannot hold them throws.
template <class M>
concept HasMaxContext = requires(const M& cm) {
  { cm.max_context() } -> std::convertible_to<std::size_t>;
};

}  // namespace specdec
