// specdec/llama/detail/unicode.hpp — the text side of the byte-level BPE tokenizer: UTF-8 decoding, the
// letter/number/whitespace classes of a codepoint, the GPT-2 byte <-> codepoint alphabet, and the "smollm"
// pre-tokenizer that cuts text into words before BPE.
// Entry point: split_words(). Read next: bpe.hpp (what happens to each word), ../tokenizer.hpp (the user API).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/llama/detail/unicode_tables.hpp"

namespace specdec::llama::detail {

// ---------------------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------------------

/// Length of the UTF-8 sequence a lead byte announces; 1 for ASCII and for bytes that cannot lead a sequence.
constexpr std::size_t utf8_sequence_length(unsigned char lead) {
  if (lead >= 0xC0 && lead < 0xE0) return 2;
  if (lead >= 0xE0 && lead < 0xF0) return 3;
  if (lead >= 0xF0 && lead < 0xF8) return 4;
  return 1;
}

/// One decoded character: its codepoint and how many bytes it spans. An invalid byte decodes as itself
/// (codepoint = the byte value, length 1, valid = false) so that no input byte is ever lost.
struct Utf8Char {
  char32_t codepoint;
  std::uint32_t length;
  bool valid;
};

/// Decodes the character starting at byte `pos` of `text`.
/// requires: pos < text.size().
inline Utf8Char decode_utf8(std::string_view text, std::size_t pos) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  const std::size_t length = utf8_sequence_length(lead);
  if (length == 1) return {lead, 1, lead < 0x80};
  if (pos + length > text.size()) return {lead, 1, false};
  char32_t cp = lead & (0x7F >> length);
  for (std::size_t i = 1; i < length; ++i) {
    const auto byte = static_cast<unsigned char>(text[pos + i]);
    if ((byte & 0xC0) != 0x80) return {lead, 1, false};
    cp = (cp << 6) | (byte & 0x3F);
  }
  return {cp, static_cast<std::uint32_t>(length), true};
}

/// Appends the UTF-8 encoding of `cp` to `out`.
inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Character classes: the only distinctions the pre-tokenizer regexes make
// ---------------------------------------------------------------------------------------------------------

enum class CharClass : std::uint8_t {
  other,       // [^\s\p{L}\p{N}]: punctuation, symbols, marks, controls, unassigned, invalid bytes
  letter,      // \p{L}
  number,      // \p{N}
  whitespace,  // \s (the Unicode White_Space property, as in Oniguruma, Rust regex and llama.cpp)
};

/// The White_Space property (25 codepoints, unchanged since Unicode 6.3).
constexpr bool is_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

/// Class of one codepoint: ASCII by direct tests, the rest by binary search in the generated ranges.
inline CharClass classify(char32_t cp) {
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    return is_whitespace(cp) ? CharClass::whitespace : CharClass::other;
  }
  if (is_whitespace(cp)) return CharClass::whitespace;
  const auto* end = std::end(category_ranges);
  const auto* it = std::upper_bound(std::begin(category_ranges), end, cp,
                                    [](char32_t c, const CategoryRange& r) { return c < r.first; });
  if (it == std::begin(category_ranges)) return CharClass::other;
  --it;
  if (cp > it->last) return CharClass::other;
  return it->category == 1 ? CharClass::letter : CharClass::number;
}

// ---------------------------------------------------------------------------------------------------------
// The GPT-2 byte-level alphabet
// ---------------------------------------------------------------------------------------------------------

/// Byte -> codepoint map of byte-level BPE: printable bytes (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) map to
/// themselves, the other 68 bytes, in ascending order, to U+0100..U+0143 (space -> U+0120 'Ġ').
inline constexpr std::array<char32_t, 256> byte_to_codepoint = [] {
  std::array<char32_t, 256> map{};
  char32_t next = 0x100;
  for (std::size_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}();

/// Turns a vocabulary string written in the byte-level alphabet back into the raw bytes it stands for.
/// Codepoints outside the alphabet are kept as their own UTF-8 (llama.cpp would reject such a token).
inline std::string alphabet_to_bytes(std::string_view text) {
  static constexpr auto inverse = [] {
    std::array<std::uint8_t, 0x144> map{};
    for (std::size_t b = 0; b < 256; ++b) map[byte_to_codepoint[b]] = static_cast<std::uint8_t>(b);
    return map;
  }();
  std::string bytes;
  bytes.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) {
    const Utf8Char c = decode_utf8(text, pos);
    const bool in_alphabet = c.valid && c.codepoint < 0x144 && byte_to_codepoint[inverse[c.codepoint]] == c.codepoint;
    if (in_alphabet) {
      bytes += static_cast<char>(inverse[c.codepoint]);
    } else {
      bytes.append(text.substr(pos, c.length));
    }
    pos += c.length;
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------------------------
// Pre-tokenizer ("smollm", shared by starcoder/refact/command-r/...): two regexes applied in cascade
//   (a) \p{N}                       every number character becomes a word of its own;
//   (b) 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//       applied to each piece left by (a). Text between matches is kept, so the words cover the input.
// (b) is matched by hand, following llama.cpp's unicode_regex_split_custom_gpt2.
// ---------------------------------------------------------------------------------------------------------

/// Scratch space for split_words, reused across calls to avoid reallocations.
struct SplitBuffers {
  std::vector<std::uint32_t> offsets;  // [chars + 1] byte offset of each character, then text.size()
  std::vector<CharClass> classes;      // [chars]
  std::vector<char32_t> codepoints;    // [chars]
};

namespace split_detail {

/// Regex (b) on the characters [begin, end): appends each match to `words`.
inline void split_gpt2(std::string_view text, const SplitBuffers& b, std::size_t begin, std::size_t end,
                       std::vector<std::string_view>& words) {
  const auto cls = [&](std::size_t i) { return i < end ? b.classes[i] : CharClass::whitespace; };
  const auto in_range_class = [&](std::size_t i, CharClass c) { return i < end && b.classes[i] == c; };
  std::size_t start = begin;
  const auto emit = [&](std::size_t stop) {
    if (stop > start) words.push_back(text.substr(b.offsets[start], b.offsets[stop] - b.offsets[start]));
    start = stop;
  };
  for (std::size_t pos = begin; pos < end;) {
    const char32_t cp = b.codepoints[pos];
    // 's|'t|'re|'ve|'m|'ll|'d (lowercase only)
    if (cp == U'\'' && pos + 1 < end) {
      const char32_t n1 = b.codepoints[pos + 1];
      if (n1 == U's' || n1 == U't' || n1 == U'm' || n1 == U'd') {
        emit(pos += 2);
        continue;
      }
      if (pos + 2 < end) {
        const char32_t n2 = b.codepoints[pos + 2];
        if ((n1 == U'r' && n2 == U'e') || (n1 == U'v' && n2 == U'e') || (n1 == U'l' && n2 == U'l')) {
          emit(pos += 3);
          continue;
        }
      }
    }
    // ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: a single leading space joins the run that follows.
    // Past the end counts as whitespace, so a trailing space falls through to the whitespace rules.
    const CharClass next = cp == U' ' ? cls(pos + 1) : b.classes[pos];
    if (next != CharClass::whitespace) {
      pos += cp == U' ' ? 1 : 0;
      while (in_range_class(pos, next)) ++pos;
      emit(pos);
      continue;
    }
    std::size_t spaces = 0;
    while (in_range_class(pos + spaces, CharClass::whitespace)) ++spaces;
    // \s+(?!\S): inside the piece, a run of >= 2 leaves its last whitespace to the next word.
    if (spaces > 1 && pos + spaces < end) {
      emit(pos += spaces - 1);
      continue;
    }
    // \s+
    emit(pos += std::max<std::size_t>(spaces, 1));
  }
}

}  // namespace split_detail

/// Cuts `text` into the words BPE runs on, appending views into `text` to `words` (cleared first).
/// Invalid UTF-8 bytes are single characters of class `other` (llama.cpp turns them into U+FFFD, which
/// splits the same way; here the bytes themselves are kept so they survive a round trip).
inline void split_words(std::string_view text, std::vector<std::string_view>& words, SplitBuffers& b) {
  words.clear();
  b.offsets.clear();
  b.classes.clear();
  b.codepoints.clear();
  for (std::size_t pos = 0; pos < text.size();) {
    const Utf8Char c = decode_utf8(text, pos);
    b.offsets.push_back(static_cast<std::uint32_t>(pos));
    b.codepoints.push_back(c.valid ? c.codepoint : 0xFFFD);
    b.classes.push_back(c.valid ? classify(c.codepoint) : CharClass::other);
    pos += c.length;
  }
  b.offsets.push_back(static_cast<std::uint32_t>(text.size()));
  // Regex (a): each number character alone; regex (b) on the runs in between.
  const std::size_t chars = b.classes.size();
  std::size_t run = 0;
  for (std::size_t i = 0; i < chars; ++i) {
    if (b.classes[i] != CharClass::number) continue;
    split_detail::split_gpt2(text, b, run, i, words);
    words.push_back(text.substr(b.offsets[i], b.offsets[i + 1] - b.offsets[i]));
    run = i + 1;
  }
  split_detail::split_gpt2(text, b, run, chars, words);
}

/// Convenience overload with its own scratch space.
inline std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  SplitBuffers buffers;
  split_words(text, words, buffers);
  return words;
}

}  // namespace specdec::llama::detail
