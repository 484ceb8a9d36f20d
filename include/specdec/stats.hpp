// specdec/stats.hpp — what a generate() call is asked to do and what it reports back.
// Entry points: GenerateOptions (input), Generation and DecodeStats (output). Read next: decoder.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "specdec/tensor.hpp"

namespace specdec {

/// Why generation ended.
enum class StopReason {
  max_tokens,  // max_new_tokens reached
  stop_token,  // a stop token was emitted; it is the last element of Generation::tokens
  callback,    // on_token returned false
};

/// Counters of one generate() call. "Round": one target verify call and the drafting before it.
struct DecodeStats {
  std::size_t rounds = 0;
  std::size_t drafted_tokens = 0;        // draft proposals sent to the target
  std::size_t accepted_tokens = 0;       // proposals the target accepted
  std::size_t target_forward_calls = 0;  // including the prompt's
  std::size_t draft_forward_calls = 0;   // including the prompt's
  std::size_t draft_catch_up_calls = 0;  // of draft_forward_calls: calls that fed the draft, before a round's
                                         // drafting, tokens it had not seen: the last proposal of a fully accepted
                                         // round, or every token of the rounds without drafting before it (one
                                         // call); through its append(), else a forward(). Not the prompt's call
  std::size_t generated_tokens = 0;      // == Generation::tokens.size()
  std::size_t prompt_tokens = 0;
  std::size_t reused_prompt_tokens = 0;  // prompt prefix the target already held from an earlier call
  std::vector<std::size_t> drafted_at;   // [draft position]: proposals there that the target examined (all earlier accepted)
  std::vector<std::size_t> accepted_at;  // [draft position]: of those, accepted
  std::vector<std::size_t> draft_lengths;  // [round]: that round's draft length, the policy's k capped to the
                                           // output and context left (RoundReport::requested)
  std::vector<std::size_t> verify_widths;  // [round]: positions the target scored in that round's verify call
  std::vector<double> verify_seconds;      // [round]: wall time of that verify call
  double draft_seconds = 0.0;   // wall time inside the draft's forward calls
  double target_seconds = 0.0;  // wall time inside the target's forward calls
  double prefill_seconds = 0.0;  // of target_seconds + draft_seconds: spent on the prompt
  double total_seconds = 0.0;   // wall time of the whole generate() call

  /// accepted / drafted (0 when nothing was drafted).
  double acceptance_rate() const { return ratio(accepted_tokens, drafted_tokens); }
  /// Acceptance rate at one draft position (0-based), given the draft reached that position.
  double acceptance_rate_at(std::size_t position) const {
    return position < drafted_at.size() ? ratio(accepted_at[position], drafted_at[position]) : 0.0;
  }
  /// Mean new tokens per target call after the prompt: tau in the papers.
  double tokens_per_target_call() const { return ratio(generated_tokens, rounds); }
  /// New tokens per second of generation, prompt processing excluded.
  double tokens_per_second() const {
    const double seconds = total_seconds - prefill_seconds;
    return seconds > 0.0 ? static_cast<double>(generated_tokens) / seconds : 0.0;
  }

 private:
  static double ratio(std::size_t a, std::size_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }
};

/// The result of generate(): the new tokens only (not the prompt), counters, and why it stopped.
struct Generation {
  std::vector<Token> tokens;
  DecodeStats stats;
  StopReason stop_reason = StopReason::max_tokens;
};

/// What to generate.
struct GenerateOptions {
  std::size_t max_new_tokens = 128;
  std::size_t draft_length = 4;      // k: proposals per round (the maximum, with an adaptive draft length);
                                     // at most max_draft_length (256) with a fixed one
  std::vector<Token> stop_tokens{};  // generation ends right after emitting one of these
  std::uint64_t seed = 0;            // same seed, same tokens: with CoupledSampling for any draft and k; with
                                     // RejectionSampling for the same draft and the same k each round (an
                                     // adaptive k follows measured times, so it may differ from run to run)
  std::function<bool(Token)> on_token{};  // called once per final token, in order; return false to stop
  /// Ends a round's drafting when the draft's most probable token has probability below this (llama.cpp's
  /// draft p-min), so a weak draft costs little. 0 = off. A flat draft row (no preference) always ends drafting.
  float draft_p_min = 0.0f;
};

}  // namespace specdec
