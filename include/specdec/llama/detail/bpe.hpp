// specdec/llama/detail/bpe.hpp — the merge loop of byte-level BPE, working on token ids.
// Entry point: bpe_word(). Read next: ../tokenizer.hpp (which builds the MergeTable from the vocabulary).
//
// A word starts as one symbol per byte (each byte is one codepoint of the byte-level alphabet, hence one
// single-character token). Then, repeatedly, the adjacent pair with the lowest merge rank is replaced by the
// token it merges into, the leftmost pair first on a tie, until no adjacent pair has a merge. Symbols live
// in a doubly linked list; candidate pairs in a min-heap keyed by (rank, position), checked for staleness
// when popped. This is O(n log n) in the word length, so long runs of spaces or digits-free punctuation stay cheap.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <string_view>
#include <vector>

#include "specdec/tensor.hpp"

namespace specdec::llama::detail {

/// What a merge rule produces: its rank (index in the merges list; lower merges first) and the merged token.
struct MergeRule {
  std::int32_t rank;
  Token merged;
};

/// Open-addressing hash map from a pair of token ids (left, right) to its MergeRule.
class MergeTable {
 public:
  /// Prepares room for `count` rules; clears the table.
  void reserve(std::size_t count) {
    const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(16, 2 * count));
    shift_ = 64 - std::countr_zero(capacity);
    keys_.assign(capacity, empty_key);
    rules_.assign(capacity, MergeRule{0, 0});
    size_ = 0;
  }

  /// Adds the rule for (left, right) unless the pair already has one (the lower rank, added first, wins).
  /// requires: reserve() was called with room for this rule; left, right >= 0.
  void insert(Token left, Token right, MergeRule rule) {
    const std::uint64_t key = make_key(left, right);
    for (std::size_t slot = home(key);; slot = (slot + 1) & (keys_.size() - 1)) {
      if (keys_[slot] == key) return;
      if (keys_[slot] == empty_key) {
        keys_[slot] = key;
        rules_[slot] = rule;
        ++size_;
        return;
      }
    }
  }

  /// The rule merging (left, right), or nullptr when there is none.
  const MergeRule* find(Token left, Token right) const {
    if (keys_.empty() || left < 0 || right < 0) return nullptr;
    const std::uint64_t key = make_key(left, right);
    for (std::size_t slot = home(key);; slot = (slot + 1) & (keys_.size() - 1)) {
      if (keys_[slot] == key) return &rules_[slot];
      if (keys_[slot] == empty_key) return nullptr;
    }
  }

  /// Number of rules stored.
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};  // never a key: ids are non-negative int32

  static std::uint64_t make_key(Token left, Token right) {
    return (std::uint64_t(std::uint32_t(left)) << 32) | std::uint32_t(right);
  }
  std::size_t home(std::uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }

  std::vector<std::uint64_t> keys_;  // [capacity] (left << 32 | right), empty_key for a free slot
  std::vector<MergeRule> rules_;     // [capacity]
  std::size_t size_ = 0;
  int shift_ = 60;
};

/// Scratch space for bpe_word, reused across words.
struct BpeBuffers {
  struct Symbol {
    Token id;          // current token of this symbol; removed_symbol once merged into its left neighbour
    std::int32_t prev;  // index of the previous live symbol, -1 at the start
    std::int32_t next;  // index of the next live symbol, -1 at the end
  };
  struct Candidate {
    std::int32_t rank;
    std::int32_t left;  // index of the left symbol of the pair
    Token left_id;      // the pair as it was when pushed: a popped candidate is stale if either changed
    Token right_id;
    Token merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  static constexpr Token removed_symbol = -2;

  std::vector<Symbol> symbols;  // [bytes of the word]
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
};

/// Runs BPE on one word (raw bytes) and appends the resulting token ids to `out`.
/// `byte_tokens[b]` is the token of the single alphabet character for byte b, or -1 if the vocabulary lacks
/// it; such bytes never merge and are dropped from the output (llama.cpp drops unknown pieces too).
inline void bpe_word(std::string_view word, const std::array<Token, 256>& byte_tokens, const MergeTable& merges,
                     BpeBuffers& buf, std::vector<Token>& out) {
  if (word.size() == 1) {
    if (const Token t = byte_tokens[static_cast<unsigned char>(word[0])]; t >= 0) out.push_back(t);
    return;
  }
  const auto n = static_cast<std::int32_t>(word.size());
  buf.symbols.resize(word.size());
  // Symbols link to each other by int32 index, -1 for none: a pointer indexes them without a conversion.
  BpeBuffers::Symbol* const sym = buf.symbols.data();
  const char* const bytes = word.data();
  for (std::int32_t i = 0; i < n; ++i)
    sym[i] = {byte_tokens[static_cast<unsigned char>(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1};

  const auto push_pair = [&](std::int32_t left) {
    if (left < 0) return;
    const std::int32_t right = sym[left].next;
    if (right < 0) return;
    if (const MergeRule* rule = merges.find(sym[left].id, sym[right].id))
      buf.heap.push({rule->rank, left, sym[left].id, sym[right].id, rule->merged});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!buf.heap.empty()) {
    const BpeBuffers::Candidate c = buf.heap.top();
    buf.heap.pop();
    const std::int32_t right = sym[c.left].next;
    if (sym[c.left].id != c.left_id || right < 0 || sym[right].id != c.right_id) continue;  // stale
    // Merge right into left, unlink right, then offer the two new neighbouring pairs.
    sym[c.left].id = c.merged;
    sym[right].id = BpeBuffers::removed_symbol;
    sym[c.left].next = sym[right].next;
    if (sym[right].next >= 0) sym[sym[right].next].prev = c.left;
    push_pair(sym[c.left].prev);
    push_pair(c.left);
  }
  for (std::int32_t i = 0; i >= 0; i = sym[i].next)
    if (sym[i].id >= 0) out.push_back(sym[i].id);
}

}  // namespace specdec::llama::detail
