// specdec/llama/tokenizer.hpp — SmolLM2's byte-level BPE tokenizer (GGUF "gpt2" model, "smollm" pre-tokenizer),
// its ChatML prompt format, and TextStream for printing tokens as they are generated.
// Entry point: Tokenizer::from_gguf(file), then encode(Tokenizer::chat_prompt("Hi")) and decode(tokens).
// Read next: detail/unicode.hpp (pre-tokenizer), detail/bpe.hpp (merge loop).
//
// encode() follows llama.cpp's tokenization of a "gpt2"/"smollm" vocabulary:
//   1. split the text on special tokens (longest first; control tokens only when parse_special is true);
//   2. cut each remaining fragment into words (detail::split_words: digits alone, then the GPT-2 regex);
//   3. run rank-ordered BPE on each word's bytes (detail::bpe_word). No BOS is added.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/llama/detail/bpe.hpp"
#include "specdec/llama/detail/unicode.hpp"
#include "specdec/llama/gguf.hpp"
#include "specdec/tensor.hpp"

namespace specdec::llama {

/// One turn of a conversation: role is "system", "user" or "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

/// GGUF token types (tokenizer.ggml.token_type); an empty types list means every token is normal.
enum class TokenType : std::int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

/// Byte-level BPE over a GGUF file's tokenizer.ggml.* tables (model "gpt2"; SmolLM2's pre-tokenizer is "smollm"):
/// encode() with special tokens, decode(), the stop tokens and the SmolLM2 chat template. Immutable once built.
///   const auto tokenizer = specdec::llama::Tokenizer::from_gguf(file);
///   const std::vector<specdec::Token> ids = tokenizer.encode(specdec::llama::Tokenizer::chat_prompt("Hi"));
class Tokenizer {
 public:
  /// The raw tables a tokenizer is built from, as stored in a GGUF file.
  struct Vocabulary {
    std::vector<std::string> tokens;    // [vocab] token text in the byte-level alphabet (" the" is "Ġthe")
    std::vector<std::int32_t> types{};  // [vocab] TokenType values, or empty (all normal)
    std::vector<std::string> merges{};  // [rules] "left right"; the index is the rank
    Token bos = -1;                     // -1: none
    Token eos = -1;                     // -1: none
  };

  /// Builds a tokenizer from raw tables.
  /// requires: tokens non-empty, fewer than 2^31; types empty or one per token, each 0 (undefined) or a
  ///   TokenType; every merge has a space after its first character, and its two parts and their
  ///   concatenation are tokens; bos and eos are -1 or valid ids. Throws specdec::Error otherwise.
  /// Duplicate token strings: the last one wins when text is looked up (as in llama.cpp).
  explicit Tokenizer(Vocabulary vocabulary)
      : tokens_(std::move(vocabulary.tokens)), types_(std::move(vocabulary.types)),
        bos_(vocabulary.bos), eos_(vocabulary.eos) {
    if (tokens_.empty()) specdec::detail::fail("tokenizer vocabulary is empty (tokenizer.ggml.tokens)");
    if (tokens_.size() >= (std::size_t{1} << 31))
      specdec::detail::fail("tokenizer has ", tokens_.size(), " tokens, at most 2^31 - 1 supported (int32 ids)");
    if (!types_.empty() && types_.size() != tokens_.size())
      specdec::detail::fail("tokenizer has ", types_.size(), " token types (tokenizer.ggml.token_type), expected one per token (",
                            tokens_.size(), ")");
    for (std::size_t i = 0; i < types_.size(); ++i) check_token_type(i, types_[i]);
    if (types_.empty()) types_.assign(tokens_.size(), static_cast<std::int32_t>(TokenType::normal));
    check_special_id("bos", bos_);
    check_special_id("eos", eos_);
    index_tokens();
    index_merges(vocabulary.merges);
  }

  /// Reads tokenizer.ggml.{model, pre, tokens, token_type, merges, bos_token_id, eos_token_id}.
  /// requires: model "gpt2" (byte-level BPE). pre: one of the pre-tokenizers llama.cpp runs with exactly this
  /// digit-then-GPT-2 regex pair (smollm, starcoder, refact, command-r, codeshell, exaone, minerva); any other
  /// value is rejected rather than tokenized with the wrong regex, and so is a file without the key (llama.cpp
  /// splits those with its "default" regexes, which differ from these).
  static Tokenizer from_gguf(const gguf::File& file) {
    if (!file.has("tokenizer.ggml.model")) specdec::detail::fail(file.name(), ": no tokenizer.ggml.model key");
    const std::string model = file.get_string("tokenizer.ggml.model");
    if (model != "gpt2")
      specdec::detail::fail(file.name(), ": tokenizer.ggml.model is \"", model, "\", expected \"gpt2\" (byte-level bpe)");
    if (!file.has("tokenizer.ggml.pre"))
      specdec::detail::fail(file.name(), ": no tokenizer.ggml.pre key, expected \"smollm\" (an older conversion: ",
                            "llama.cpp splits its text with other regexes, which specdec does not implement)");
    const std::string pre = file.get_string("tokenizer.ggml.pre");
    constexpr std::array<std::string_view, 7> same_regexes{"smollm", "starcoder", "refact", "command-r",
                                                           "codeshell", "exaone", "minerva"};
    if (std::find(same_regexes.begin(), same_regexes.end(), pre) == same_regexes.end())
      specdec::detail::fail(file.name(), ": tokenizer.ggml.pre is \"", pre, "\", expected \"smollm\" or another ",
                            "pre-tokenizer with its regexes (starcoder, refact, command-r, codeshell, exaone, minerva)");
    Vocabulary v;
    v.tokens = file.get_string_array("tokenizer.ggml.tokens");
    if (file.has("tokenizer.ggml.token_type")) {
      const auto types = file.get_int_array("tokenizer.ggml.token_type");
      v.types.reserve(types.size());
      gguf::naming_file(file, [&] {
        for (std::size_t i = 0; i < types.size(); ++i) {
          check_token_type(i, types[i]);  // before narrowing: 2^32 + 1 would pass as 1
          v.types.push_back(static_cast<std::int32_t>(types[i]));
        }
      });
    }
    v.merges = file.get_string_array("tokenizer.ggml.merges");
    const auto special_id = [&](std::string_view key) -> Token {
      const auto id = file.find_uint(key);
      if (!id) return -1;
      if (*id >= v.tokens.size())
        specdec::detail::fail(file.name(), ": ", key, " is ", *id, ", expected below the vocabulary size ", v.tokens.size());
      return static_cast<Token>(*id);
    };
    v.bos = special_id("tokenizer.ggml.bos_token_id");
    v.eos = special_id("tokenizer.ggml.eos_token_id");
    return gguf::naming_file(file, [&] { return Tokenizer(std::move(v)); });
  }

  /// Number of tokens in the vocabulary.
  std::size_t size() const { return tokens_.size(); }
  /// encode() takes texts shorter than this: 2 GiB.
  static constexpr std::size_t max_text_bytes = std::size_t{1} << 31;

  /// Beginning-of-sequence token (-1 if the vocabulary has none). encode() never adds it.
  Token bos() const { return bos_; }
  /// End-of-sequence token (-1 if the vocabulary has none).
  Token eos() const { return eos_; }
  /// The vocabulary strings, in the byte-level alphabet.  // [vocab]
  const std::vector<std::string>& tokens() const { return tokens_; }
  /// Type of token t. requires: t is a valid id.
  TokenType type(Token t) const { return static_cast<TokenType>(types_[checked(t)]); }
  /// True for control tokens (<|im_start|>, <|im_end|>, ...): they decode to nothing.
  bool is_control(Token t) const { return type(t) == TokenType::control; }

  /// The id of the token whose vocabulary string (byte-level alphabet) is `text`, if any.
  std::optional<Token> find(std::string_view text) const {
    const auto it = ids_.find(text);
    return it == ids_.end() ? std::nullopt : std::optional<Token>(it->second);
  }

  /// Tokens that end generation: eos, <|im_end|> and <|endoftext|> when the vocabulary has them.
  std::vector<Token> stop_tokens() const {
    std::vector<Token> stops;
    const auto add = [&](std::optional<Token> t) {
      if (t && *t >= 0 && std::find(stops.begin(), stops.end(), *t) == stops.end()) stops.push_back(*t);
    };
    add(eos_);
    add(find("<|im_end|>"));
    add(find("<|endoftext|>"));
    return stops;
  }

  /// Tokenizes UTF-8 text; bytes that are not valid UTF-8 are tokenized as bytes too. A byte whose
  /// single-byte token the vocabulary lacks is dropped, as llama.cpp drops it (SmolLM2 lacks 21 of the 256:
  /// 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2 and 0xF5-0xFF); first_dropped_byte() tells
  /// whether a text has one. With parse_special, the text of control tokens (e.g. "<|im_start|>") becomes that
  /// token; without it, it is tokenized as plain text. User-defined tokens are always matched. No BOS is
  /// prepended.
  /// Example: encode(" 2024") -> the tokens for " ", "2", "0", "2", "4".
  /// Throws specdec::Error for a text of max_text_bytes or more (the pre-tokenizer keeps 32-bit offsets).
  std::vector<Token> encode(std::string_view text, bool parse_special = true) const {
    if (text.size() >= max_text_bytes)
      specdec::detail::fail("tokenizer input of ", text.size(), " bytes, at most ", max_text_bytes - 1, " supported");
    std::vector<Token> out;
    out.reserve(text.size() / 3 + 4);
    std::vector<std::string_view> words;
    detail::SplitBuffers split_buffers;
    detail::BpeBuffers bpe_buffers;
    for (const Fragment& f : partition_special(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      detail::split_words(f.text, words, split_buffers);
      for (std::string_view word : words) detail::bpe_word(word, byte_tokens_, merges_, bpe_buffers, out);
    }
    return out;
  }

  /// The offset in `text` of the first byte that encode(text, parse_special) drops because the vocabulary has
  /// no token for it (see encode), or nullopt where it keeps every byte.
  std::optional<std::size_t> first_dropped_byte(std::string_view text, bool parse_special = true) const {
    for (const Fragment& f : partition_special(text, parse_special)) {
      if (f.token >= 0) continue;
      for (std::size_t i = 0; i < f.text.size(); ++i)
        if (byte_tokens_[static_cast<unsigned char>(f.text[i])] < 0)
          return static_cast<std::size_t>(f.text.data() - text.data()) + i;
    }
    return std::nullopt;
  }

  /// The bytes a token stands for: normal tokens their decoded bytes (possibly part of a UTF-8 character),
  /// other tokens (control, user-defined, ...) their text as written in the vocabulary.
  std::string token_bytes(Token t) const {
    const std::size_t i = checked(t);
    return type(t) == TokenType::normal ? bytes_[i] : tokens_[i];
  }

  /// Concatenates the bytes of the tokens; control, unknown, unused and byte-type tokens give nothing.
  /// The result is raw UTF-8 and may end inside a character (see TextStream).
  std::string decode(std::span<const Token> tokens) const {
    std::string text;
    for (Token t : tokens) text += bytes_[checked(t)];
    return text;
  }

  /// Renders messages in SmolLM2's ChatML, as the file's tokenizer.chat_template does. If the first message is
  /// not a system message, the default system turn ("You are a helpful AI assistant named SmolLM, trained by
  /// Hugging Face") comes first; no messages give no turns at all. With
  /// add_generation_prompt the text ends with "<|im_start|>assistant\n", ready for generation.
  /// Encode the result with parse_special = true.
  static std::string chat_prompt(std::span<const ChatMessage> messages, bool add_generation_prompt = true) {
    std::string prompt;
    if (!messages.empty() && messages.front().role != "system")
      prompt += "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
    for (const ChatMessage& m : messages) prompt += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (add_generation_prompt) prompt += "<|im_start|>assistant\n";
    return prompt;
  }

  /// chat_prompt for a single user message, with the generation prompt.
  static std::string chat_prompt(std::string_view user_message) {
    const ChatMessage message{"user", std::string(user_message)};
    return chat_prompt(std::span<const ChatMessage>(&message, 1));
  }

 private:
  /// A piece of input: either plain text to pre-tokenize (token == -1) or one special token.
  struct Fragment {
    std::string_view text;
    Token token;
  };

  /// Heterogeneous lookup so find() takes a string_view without allocating.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::size_t checked(Token t) const {
    if (t < 0 || static_cast<std::size_t>(t) >= tokens_.size())
      specdec::detail::fail("token id ", t, " is out of range for a vocabulary of ", tokens_.size(), " tokens");
    return static_cast<std::size_t>(t);
  }

  /// A token type is 0 (undefined) or a TokenType.
  static void check_token_type(std::size_t i, std::int64_t type) {
    if (type < 0 || type > static_cast<std::int64_t>(TokenType::byte))
      specdec::detail::fail("tokenizer.ggml.token_type of token ", i, " is ", type, ", expected 0 to 6");
  }

  void check_special_id(std::string_view what, Token t) const {
    if (t < -1 || t >= static_cast<Token>(tokens_.size()))
      specdec::detail::fail(what, " token id ", t, " is out of range for a vocabulary of ", tokens_.size(), " tokens");
  }

  /// Fills ids_, bytes_, byte_tokens_ and the special-token list.
  void index_tokens() {
    ids_.reserve(tokens_.size());
    bytes_.resize(tokens_.size());
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      const auto t = static_cast<Token>(i);
      ids_.insert_or_assign(tokens_[i], t);
      const auto type = static_cast<TokenType>(types_[i]);
      if (type == TokenType::normal) bytes_[i] = detail::alphabet_to_bytes(tokens_[i]);
      if (type == TokenType::user_defined) bytes_[i] = tokens_[i];
      const bool special = type == TokenType::control || type == TokenType::user_defined || type == TokenType::unknown;
      if (special && !tokens_[i].empty()) specials_.push_back(t);
    }
    // Longest first, so a special token containing another one wins (llama.cpp's order; ties by id).
    std::stable_sort(specials_.begin(), specials_.end(),
                     [&](Token a, Token b) { return tokens_[checked(a)].size() > tokens_[checked(b)].size(); });
    byte_tokens_.fill(-1);
    for (std::size_t b = 0; b < 256; ++b) {
      std::string character;
      detail::append_utf8(character, detail::byte_to_codepoint[b]);
      // Whatever the token's type, as llama.cpp looks tokens up by text alone: a control token "a" still starts
      // the merges of "ab" when special tokens are not parsed.
      if (const auto id = find(character)) byte_tokens_[b] = *id;
    }
  }

  /// Fills merges_: (left id, right id) -> (rank, merged id). Each rule is split at the first space after
  /// its first character (llama.cpp's find(' ', 1)), so a left part may itself be a space-like character.
  void index_merges(const std::vector<std::string>& merges) {
    if (merges.size() >= (std::size_t{1} << 31))
      specdec::detail::fail("tokenizer has ", merges.size(), " merges, at most 2^31 - 1 supported (int32 ranks)");
    merges_.reserve(merges.size());
    std::string joined;
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string_view rule = merges[rank];
      const std::size_t space = rule.find(' ', 1);
      if (rule.empty() || space == std::string_view::npos)
        specdec::detail::fail("tokenizer merge ", rank, " \"", rule, "\" (tokenizer.ggml.merges) has no space separating its two parts");
      const std::string_view left = rule.substr(0, space);
      const std::string_view right = rule.substr(space + 1);
      joined.assign(left).append(right);
      const auto l = find(left), r = find(right), m = find(joined);
      // A rule over strings that are not tokens could never apply; in a file, it means the tables disagree.
      if (!l || !r || !m)
        specdec::detail::fail("tokenizer merge ", rank, " \"", rule, "\" (tokenizer.ggml.merges): \"",
                              !l ? left : !r ? right : std::string_view(joined), "\" is not a token");
      // A rule listed twice keeps its first rank, as in llama.cpp (Hugging Face's tokenizers keeps the last).
      merges_.insert(*l, *r, {static_cast<std::int32_t>(rank), *m});
    }
  }

  /// Splits text on special tokens, longest token first, as llama.cpp's tokenizer_st_partition does.
  std::vector<Fragment> partition_special(std::string_view text, bool parse_special) const {
    std::vector<Fragment> fragments{{text, -1}};
    std::vector<Fragment> next;
    for (const Token special : specials_) {
      if (!parse_special && type(special) != TokenType::user_defined) continue;
      const std::string_view needle = tokens_[checked(special)];
      next.clear();
      for (const Fragment& f : fragments) {
        if (f.token >= 0) {
          next.push_back(f);
          continue;
        }
        std::size_t start = 0;
        for (std::size_t hit; (hit = f.text.find(needle, start)) != std::string_view::npos;) {
          if (hit > start) next.push_back({f.text.substr(start, hit - start), -1});
          next.push_back({needle, special});
          start = hit + needle.size();
        }
        if (start < f.text.size()) next.push_back({f.text.substr(start), -1});
      }
      fragments.swap(next);
    }
    return fragments;
  }

  std::vector<std::string> tokens_;                                         // [vocab] byte-level alphabet
  std::vector<std::int32_t> types_;                                         // [vocab] TokenType values
  std::vector<std::string> bytes_;                                          // [vocab] what decode() emits
  std::unordered_map<std::string, Token, StringHash, std::equal_to<>> ids_;  // vocabulary string -> id
  std::vector<Token> specials_;          // control/user-defined/unknown tokens, longest text first
  std::array<Token, 256> byte_tokens_{};  // [256] token of each byte's single alphabet character, or -1
  detail::MergeTable merges_;            // (left, right) -> (rank, merged)
  Token bos_ = -1;
  Token eos_ = -1;
};

/// Turns generated tokens into text as they arrive, holding back the bytes of a UTF-8 character until the
/// token completing it arrives, so every returned string is whole characters.
/// Example: TextStream s(tok); for (Token t : generated) std::cout << s.push(t); std::cout << s.flush();
class TextStream {
 public:
  /// requires: `tokenizer` outlives the stream.
  explicit TextStream(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  explicit TextStream(Tokenizer&&) = delete;  // a temporary would be gone before the first push

  /// Adds one token; returns the text that is now complete (possibly empty).
  std::string push(Token t) {
    const Token one[1] = {t};
    pending_ += tokenizer_->decode(one);
    // Hold back a trailing lead byte whose sequence is not complete yet (only the last 3 bytes can be one).
    std::size_t cut = pending_.size();
    for (std::size_t back = 1; back <= std::min<std::size_t>(3, pending_.size()); ++back) {
      const auto byte = static_cast<unsigned char>(pending_[pending_.size() - back]);
      if ((byte & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
      if (detail::utf8_sequence_length(byte) > back) cut = pending_.size() - back;
      break;
    }
    std::string ready = pending_.substr(0, cut);
    pending_.erase(0, cut);
    return ready;
  }

  /// Returns whatever is held back (an incomplete character at the end of generation) and resets.
  std::string flush() { return std::exchange(pending_, std::string()); }

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes of an incomplete UTF-8 character, at most 3
};

}  // namespace specdec::llama
