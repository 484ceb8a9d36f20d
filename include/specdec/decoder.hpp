// specdec/decoder.hpp — the speculative decoder and its baseline, plain autoregressive decoding.
// Entry points: SpeculativeDecoder<Draft, Target, Acceptance, DraftLength>::generate(), generate_autoregressive().
// Each round: the draft proposes up to k tokens one at a time; the target scores the last final token and all
// proposals in ONE forward call; the acceptance policy keeps a prefix of the proposals and supplies the next
// token itself; rejected proposals are rolled back from both models' caches (the decoder owns rollback).
// Read next: acceptance.hpp (how tokens are chosen), draft_length.hpp (how k is chosen).
#pragma once

#include <algorithm>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/acceptance.hpp"
#include "specdec/detail/decode_support.hpp"
#include "specdec/draft_length.hpp"
#include "specdec/model.hpp"
#include "specdec/sampling.hpp"
#include "specdec/stats.hpp"

namespace specdec {

/// Speculative decoding with a draft model and a target model that share one vocabulary.
/// Greedy output equals generate_autoregressive(target, Greedy{}, ...) token for token, for every draft and k;
/// RejectionSampling output has the same distribution as plain sampling; CoupledSampling output is the same
/// tokens as plain CoupledSampling for the same seed.
///
///   specdec::SpeculativeDecoder decoder(draft, target);             // greedy, fixed k
///   auto result = decoder.generate(prompt, {.max_new_tokens = 64});
///
/// requires: draft and target are distinct objects; both stay alive while the decoder is used.
template <Model Draft, Model Target, class Acceptance = Greedy, class DraftLength = FixedDraftLength>
  requires AcceptancePolicy<Acceptance> && DraftLengthPolicy<DraftLength>
class SpeculativeDecoder {
 public:
  /// Throws specdec::Error when the vocabularies differ, draft and target are the same object (or one is a
  /// base-class part of the other; a distinct object at the same address, such as a first member, is fine), or
  /// a policy's parameters are out of range.
  SpeculativeDecoder(Draft& draft, Target& target, Acceptance acceptance = {}, DraftLength draft_length = {})
      : draft_(draft, "draft"), target_(target, "target"), acceptance_(acceptance), length_(std::move(draft_length)) {
    if (detail::same_object(draft, target))
      detail::fail("draft and target are the same model object; speculative decoding needs two");
    if (draft_.vocab_size() != target_.vocab_size())
      detail::fail("draft vocabulary has ", draft_.vocab_size(), " tokens, target has ", target_.vocab_size());
    acceptance_.validate();
    if constexpr (HasSettingsCheck<DraftLength>) length_.validate();  // a tuning field out of range, now
  }

  /// Generates up to options.max_new_tokens tokens after `prompt`. The result equals what fresh, empty models would
  /// give; a prompt prefix the models already hold from an earlier call is reused, not recomputed. Throws
  /// specdec::Error for an empty prompt, a token outside the vocabulary, a prompt longer than the target's
  /// max_context (HasMaxContext), a draft_length above max_draft_length with FixedDraftLength (before the prompt is
  /// processed; another draft-length policy asking for more fails in that round), a model's malformed logits and a
  /// policy's token outside the vocabulary; and when the generation reaches the end of a model's context before it
  /// ends (plain decoding would too: the target holds the prompt and all but the last new token, so prompt +
  /// max_new_tokens − 1 positions fit), at that point, after the tokens before it have gone to on_token. returns: the
  /// new tokens, statistics, stop reason.
  Generation generate(std::span<const Token> prompt, const GenerateOptions& options) {
    const auto start = detail::Clock::now();
    const std::size_t vocab = target_.vocab_size();
    detail::check_request(prompt, options, vocab);
    detail::check_prompt_fits(target_.model(), prompt.size());
    if constexpr (std::is_same_v<DraftLength, FixedDraftLength>)
      if (options.draft_length > max_draft_length)
        detail::fail("draft_length ", options.draft_length, " is above max_draft_length, ", max_draft_length);
    Generation out;
    auto& stats = out.stats;
    stats.prompt_tokens = prompt.size();
    std::vector<Token> sequence(prompt.begin(), prompt.end());
    // A draft that will not be asked for a proposal is not brought up to the prompt (a later call catches up):
    // the one round of a single new token drafts nothing (k <= new tokens left - 1).
    const bool drafting = options.max_new_tokens > 1 &&
                          !(std::is_same_v<DraftLength, FixedDraftLength> && options.draft_length == 0);
    prefill(sequence, drafting, stats);
    if (options.max_new_tokens == 0) return finish(out, start);
    if constexpr (HasGenerationStart<DraftLength>) length_.begin_generation();

    typename Acceptance::Session session(acceptance_, vocab, options.seed);
    detail::Emitter emitter(options, out, sequence);
    std::vector<Token> drafts, feed;
    for (bool done = false; !done;) {
      const auto round_start = detail::Clock::now();
      const auto asked = static_cast<std::size_t>(length_.next(options));
      if (asked > max_draft_length)
        detail::fail("the draft-length policy asked for ", asked, " tokens, above max_draft_length, ", max_draft_length);
      const std::size_t k = std::min({asked, emitter.remaining() - 1, room(sequence.size())});
      stats.draft_lengths.push_back(k);
      RoundReport report{.requested = k};
      draft(sequence, k, options, session, drafts, report, stats);
      const auto [accepted, next] = verify(sequence, drafts, session, feed, report, stats);
      ++stats.rounds;
      report.round_seconds = detail::seconds_since(round_start);
      length_.observe(report);

      for (std::size_t i = 0; i < accepted && !done; ++i) done = emitter.emit(drafts[i]);
      if (!done) done = emitter.emit(next);
    }
    return finish(out, start);
  }

  /// The draft-length policy, with whatever it has learned.
  const DraftLength& draft_length_policy() const { return length_; }
  const Acceptance& acceptance() const { return acceptance_; }

 private:
  /// Brings the target, and the draft when `drafting`, to hold the prompt minus its last token (reusing what
  /// they already hold).
  void prefill(std::span<const Token> sequence, bool drafting, DecodeStats& stats) {
    const std::size_t n = sequence.size();
    const double before = stats.target_seconds + stats.draft_seconds;
    const std::size_t held = target_.sync(sequence, n - 1);
    stats.reused_prompt_tokens = held;
    if (held < n - 1)
      target_.append(sequence.subspan(held, n - 1 - held), stats.target_seconds, stats.target_forward_calls);
    if (drafting && room(n) > 0) {  // else a draft too small for the prompt sits out: every round then has k = 0
      const std::size_t draft_held = draft_.sync(sequence, n - 1);
      if (draft_held < n - 1)
        draft_.append(sequence.subspan(draft_held, n - 1 - draft_held), stats.draft_seconds, stats.draft_forward_calls);
    }
    stats.prefill_seconds = stats.target_seconds + stats.draft_seconds - before;
  }

  /// The most proposals a round may make after n tokens within both models' contexts (HasMaxContext): the
  /// target holds n + k positions after verifying k proposals, the draft n + k - 1 after proposing them.
  std::size_t room(std::size_t n) {
    std::size_t room = std::numeric_limits<std::size_t>::max();
    if constexpr (HasMaxContext<Target>) {
      const auto most = static_cast<std::size_t>(target_.model().max_context());
      room = most > n ? most - n : 0;
    }
    if constexpr (HasMaxContext<Draft>) {
      const auto most = static_cast<std::size_t>(draft_.model().max_context());
      room = std::min(room, most >= n ? most + 1 - n : 0);
    }
    return room;
  }

  /// Lets the draft propose up to k tokens after `sequence`, one forward call each. Drafting ends early when
  /// the draft's row is flat (no preference), its top probability is below options.draft_p_min, or the draft's
  /// budget (HasDraftBudget) is spent.
  void draft(std::span<const Token> sequence, std::size_t k, const GenerateOptions& options,
             typename Acceptance::Session& session, std::vector<Token>& drafts, RoundReport& report, DecodeStats& stats) {
    drafts.clear();
    if (k == 0) return;
    const std::size_t n = sequence.size();
    const std::size_t held = draft_.sync(sequence, n - 1);
    std::vector<Token> feed(sequence.begin() + static_cast<std::ptrdiff_t>(held), sequence.end());
    const double before = stats.draft_seconds;
    if (feed.size() > 1) {  // catching up (rounds without drafting, a fully accepted round's last proposal):
      // only the last position needs logits
      draft_.append(std::span<const Token>(feed).first(feed.size() - 1), stats.draft_seconds, stats.draft_forward_calls);
      ++stats.draft_catch_up_calls;
      report.caught_up = feed.size() - 1;
      report.catch_up_seconds = stats.draft_seconds - before;
      feed.erase(feed.begin(), feed.end() - 1);
    }
    for (std::size_t i = 0; i < k; ++i) {
      const Logits& logits = draft_.forward(feed, stats.draft_seconds, stats.draft_forward_calls);
      ++report.draft_steps;
      const auto last = logits.rows() - 1;
      const std::span<const float> row(logits.row(last).data(), static_cast<std::size_t>(logits.cols()));
      if (is_flat(row)) break;
      if (options.draft_p_min > 0.0f && top_probability(row) < static_cast<double>(options.draft_p_min)) break;
      if constexpr (HasDraftBudget<Draft>) {
        if (i == 0) k = std::min<std::size_t>(k, draft_.model().draft_budget());
        if (i >= k) break;
      }
      drafts.push_back(detail::checked_token(session.propose(row, i, n + i), draft_.vocab_size(),
                                             "the acceptance policy's propose()"));
      feed.assign(1, drafts.back());
    }
    report.drafted = drafts.size();
    report.draft_seconds = stats.draft_seconds - before;
  }

  /// The round's verify step: one target call over the last final token and every proposal, then the acceptance
  /// policy's verdict on each proposal in order until one is rejected. returns: how many were accepted, and the
  /// token after them (the policy's replacement for the rejected one, or its sample after them all).
  std::pair<std::size_t, Token> verify(std::span<const Token> sequence, std::span<const Token> drafts,
                                       typename Acceptance::Session& session, std::vector<Token>& feed,
                                       RoundReport& report, DecodeStats& stats) {
    const std::size_t vocab = target_.vocab_size(), n = sequence.size();
    const std::size_t held = target_.sync(sequence, n - 1);
    feed.assign(sequence.begin() + static_cast<std::ptrdiff_t>(held), sequence.end());
    feed.insert(feed.end(), drafts.begin(), drafts.end());
    const double before = stats.target_seconds;
    const Logits& logits = target_.forward(feed, stats.target_seconds, stats.target_forward_calls);
    report.verify_width = feed.size();
    stats.verify_widths.push_back(feed.size());
    report.verify_seconds = stats.target_seconds - before;
    stats.verify_seconds.push_back(report.verify_seconds);
    const auto first_row = static_cast<Eigen::Index>(n - 1 - held);
    const auto row = [&](std::size_t i) {
      return std::span<const float>(logits.row(first_row + static_cast<Eigen::Index>(i)).data(), vocab);
    };
    stats.drafted_tokens += drafts.size();
    if (stats.drafted_at.size() < drafts.size()) {
      stats.drafted_at.resize(drafts.size(), 0);
      stats.accepted_at.resize(drafts.size(), 0);
    }
    std::size_t accepted = 0;
    Token next = -1;
    for (; accepted < drafts.size(); ++accepted) {
      ++stats.drafted_at[accepted];
      const Verdict verdict = session.verify(row(accepted), accepted, drafts[accepted], n + accepted);
      if (!verdict.accepted) {
        next = detail::checked_token(verdict.token, vocab, "the acceptance policy's verify()");
        break;
      }
      ++stats.accepted_at[accepted];
    }
    if (accepted == drafts.size())
      next = detail::checked_token(session.sample(row(accepted), n + accepted), vocab, "the acceptance policy's sample()");
    stats.accepted_tokens += accepted;
    report.accepted = accepted;
    return {accepted, next};
  }

  static Generation& finish(Generation& out, detail::Clock::time_point start) {
    out.stats.total_seconds = detail::seconds_since(start);
    return out;
  }

  detail::TrackedModel<Draft> draft_;
  detail::TrackedModel<Target> target_;
  Acceptance acceptance_;
  DraftLength length_;
};

/// The baseline: plain decoding with the target alone, one forward call per token, with the same policy
/// semantics (Greedy: argmax; RejectionSampling: a sample from the transformed distribution; CoupledSampling:
/// the Gumbel-max choice). The target is reset first, so the result is what a fresh model gives. Throws
/// specdec::Error as SpeculativeDecoder::generate() does in every case that concerns the target alone (bad policy
/// parameters, the request, the prompt, the target's logits and context, a policy's token outside the vocabulary).
/// returns: the new tokens, statistics (one round and one target call per token after the prompt), stop reason.
template <Model Target, class Acceptance>
  requires AcceptancePolicy<Acceptance>
Generation generate_autoregressive(Target& target, Acceptance acceptance, std::span<const Token> prompt,
                                   const GenerateOptions& options) {
  const auto start = detail::Clock::now();
  acceptance.validate();
  detail::TrackedModel<Target> model(target, "target");
  const std::size_t vocab = model.vocab_size();
  detail::check_request(prompt, options, vocab);
  detail::check_prompt_fits(target, prompt.size());
  Generation out;
  auto& stats = out.stats;
  stats.prompt_tokens = prompt.size();
  std::vector<Token> sequence(prompt.begin(), prompt.end());
  model.sync({}, 0);
  if (prompt.size() > 1) model.append(prompt.first(prompt.size() - 1), stats.target_seconds, stats.target_forward_calls);
  stats.prefill_seconds = stats.target_seconds;
  if (options.max_new_tokens > 0) {
    typename Acceptance::Session session(acceptance, vocab, options.seed);
    detail::Emitter emitter(options, out, sequence);
    for (bool done = false; !done;) {
      const Token last = sequence.back();
      const double before = stats.target_seconds;
      const Logits& logits = model.forward(std::span<const Token>(&last, 1), stats.target_seconds, stats.target_forward_calls);
      ++stats.rounds;
      stats.draft_lengths.push_back(0);
      stats.verify_widths.push_back(1);
      stats.verify_seconds.push_back(stats.target_seconds - before);
      const Token next = session.sample(std::span<const float>(logits.row(0).data(), vocab), sequence.size());
      done = emitter.emit(detail::checked_token(next, vocab, "the acceptance policy's sample()"));
    }
  }
  stats.total_seconds = detail::seconds_since(start);
  return out;
}

}  // namespace specdec
