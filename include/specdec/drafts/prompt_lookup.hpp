// specdec/drafts/prompt_lookup.hpp — prompt lookup decoding (n-gram drafting): no network at all.
// Entry point: specdec::PromptLookupDraft, a specdec::Model. Read next: decoder.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/model.hpp"

namespace specdec {

/// Proposes what followed the earlier occurrence of the context's last n tokens with the largest n (up to
/// max_ngram, at least min_ngram), the most recent one among equally long matches. Its logits row is one-hot on
/// the proposal (0 for the proposal, -1e30 elsewhere: finite, and exactly one-hot after any temperature); with no
/// match the row is flat (all zeros), which ends the round's drafting. Strong on input-grounded tasks (summaries,
/// edits, extraction), where the output repeats spans of the prompt.
///
/// draft_budget() (see HasDraftBudget) caps a round by the length of the match behind its first proposal:
/// `budget[n - 1]` tokens for an n-token match, unlimited past the table. That length is counted past max_ngram
/// where the table reaches further (max_ngram only bounds the search), so that a long match found with a small
/// max_ngram is not budgeted as a short one. A one-token match is a guess and a
/// long one is usually a copied span. On the benchmark's greedy outputs (prompt lookup at every position of
/// them), the first proposal after a 1-token match was right 31% of the time and the fourth 13%; after a
/// 3-token match 68% and 44%; after a 5-token or longer one 90% and 64%. So: short rounds after short matches,
/// long ones after long matches. The defaults, 2, 2, 3 and 4 tokens after 1- to 4-token matches with matches
/// of up to 16 tokens, replayed against the cost tables of two reports, were no worse than the earlier 2 and 4
/// tokens after 1- and 2-token matches (matches of up to 5) on any task kind, and better on grounded tasks
/// (see docs/measurements.md, the 2.0× goal).
class PromptLookupDraft {
 public:
  static constexpr float kMissing = -1e30f;

  /// Default round budgets by match length: 2, 2, 3 and 4 tokens after a match of 1, 2, 3 and 4 tokens.
  static constexpr std::array<std::size_t, 4> kDefaultBudget = {2, 2, 3, 4};
  static constexpr std::size_t kDefaultMaxNgram = 16;
  /// The longest n-gram a draft may match: each step compares up to max_ngram tokens at every earlier position.
  static constexpr std::size_t kMaxNgram = 1024;

  /// Throws specdec::Error unless 0 < vocab < max_vocab_size and 1 <= min_ngram <= max_ngram <= kMaxNgram.
  /// `budget`: see draft_budget(); empty = no cap.
  explicit PromptLookupDraft(std::size_t vocab, std::size_t max_ngram = kDefaultMaxNgram, std::size_t min_ngram = 1,
                             std::vector<std::size_t> budget = {kDefaultBudget.begin(), kDefaultBudget.end()})
      : vocab_(vocab), max_ngram_(max_ngram), min_ngram_(min_ngram), budget_(std::move(budget)) {
    if (vocab == 0 || vocab >= max_vocab_size)
      detail::fail("prompt lookup draft needs a vocabulary of 1 to ", max_vocab_size - 1, " tokens, got ", vocab);
    if (min_ngram == 0 || min_ngram > max_ngram || max_ngram > kMaxNgram)
      detail::fail("prompt lookup n-gram sizes need 1 <= min <= max <= ", kMaxNgram, ", got min ", min_ngram, ", max ",
                   max_ngram);
  }

  std::size_t vocab_size() const { return vocab_; }
  std::size_t context_size() const { return context_.size(); }
  std::size_t max_ngram() const { return max_ngram_; }
  std::size_t min_ngram() const { return min_ngram_; }
  /// Length of the match behind the last proposal (0: the last row was flat).
  std::size_t match_length() const { return match_length_; }

  /// Tokens a round should draft at most, given the match behind the current proposal.
  std::size_t draft_budget() const {
    if (budget_length_ == 0) return 0;
    return budget_length_ <= budget_.size() ? budget_[budget_length_ - 1] : std::numeric_limits<std::size_t>::max();
  }

  /// Appends tokens; row j of the result is the proposal after the context up to and including tokens[j].
  const Logits& forward(std::span<const Token> tokens) {
    check_tokens(tokens);
    revision_ = next_revision();
    logits_.resize(static_cast<Eigen::Index>(tokens.size()), static_cast<Eigen::Index>(vocab_));
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      context_.push_back(tokens[j]);
      auto row = logits_.row(static_cast<Eigen::Index>(j));
      const Match match = find_match();
      match_length_ = match.length;
      budget_length_ = budget_length(match);
      if (match.next) {
        row.setConstant(kMissing);
        row(*match.next) = 0.0f;
      } else {
        row.setZero();
      }
    }
    return logits_;
  }

  /// Appends tokens without computing logits (prompt processing).
  void append(std::span<const Token> tokens) {
    check_tokens(tokens);
    revision_ = next_revision();
    context_.insert(context_.end(), tokens.begin(), tokens.end());
    match_length_ = budget_length_ = 0;
  }

  void truncate(std::size_t n) {
    revision_ = next_revision();
    if (n < context_.size()) match_length_ = budget_length_ = 0;
    context_.resize(std::min(n, context_.size()));
  }

  /// Changes with every forward, append and truncate (see specdec::HasRevision).
  std::uint64_t revision() const { return revision_; }

  /// The proposal after the current context, if any n-gram matches.
  std::optional<Token> lookup() const { return lookup_match().first; }

  /// The proposal and the length of the n-gram it matched (0 when none did).
  std::pair<std::optional<Token>, std::size_t> lookup_match() const {
    const Match match = find_match();
    return {match.next, match.length};
  }

 private:
  struct Match {
    std::optional<Token> next;  // the proposal, if any n-gram matched
    std::size_t length = 0;     // tokens matched, at most max_ngram (0: none)
    std::size_t end = 0;        // index of the match's last token
  };

  Match find_match() const {
    // One pass over the candidate ends e (each followed by a token), most recent first: the length of the
    // match ending at e is how far context_[.. e] and the context agree backwards, capped at max_ngram.
    const std::size_t length = context_.size();
    std::size_t best = 0, best_end = 0;
    for (std::size_t e = length > 0 ? length - 1 : 0; e-- > 0;) {
      std::size_t n = 0;
      while (n < max_ngram_ && n <= e && context_[e - n] == context_[length - 1 - n]) ++n;
      if (n > best) {
        best = n;
        best_end = e;
        if (best == max_ngram_) break;  // no earlier end can be longer, and ties keep the most recent
      }
    }
    if (best < min_ngram_) return {};
    return {context_[best_end + 1], best, best_end};
  }

  /// The match's length for draft_budget(): counted on past max_ngram while the budget table still tells
  /// lengths apart (up to budget_.size() + 1, which means no cap).
  std::size_t budget_length(const Match& match) const {
    std::size_t n = match.length;
    if (n == 0 || n < max_ngram_) return n;
    const std::size_t last = context_.size() - 1;
    while (n <= budget_.size() && n <= match.end && context_[match.end - n] == context_[last - n]) ++n;
    return n;
  }

  /// Throws specdec::Error, before anything changes, if a token is outside the vocabulary.
  void check_tokens(std::span<const Token> tokens) const {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= vocab_)
        detail::fail("prompt lookup draft got token ", tokens[i], " at index ", i, ", outside the vocabulary of ",
                     vocab_, " tokens");
  }

  std::size_t vocab_;
  std::size_t max_ngram_;
  std::size_t min_ngram_;
  std::vector<std::size_t> budget_;  // [match length - 1]: round budget
  std::size_t match_length_ = 0;
  std::size_t budget_length_ = 0;  // match_length_, counted past max_ngram (see budget_length())
  std::uint64_t revision_ = 0;  // see revision()
  std::vector<Token> context_;  // [tokens held]
  Logits logits_;               // [positions of the last call, vocab]
};

static_assert(Model<PromptLookupDraft>);
static_assert(HasRevision<PromptLookupDraft>);

}  // namespace specdec
