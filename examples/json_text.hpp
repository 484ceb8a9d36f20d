// examples/json_text.hpp — model text as specdec-generate writes it: JSON string literals for --json, and valid
// UTF-8 for the streamed text. Entry points: examples::json_string, examples::utf8_text. Model text is raw bytes
// and need not be valid UTF-8; both write each byte that does not start a well-formed character as U+FFFD.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

#include "specdec/error.hpp"

namespace examples {

/// JSON string literal of UTF-8 text; each byte that does not start a well-formed character
/// (specdec::detail::utf8_character) becomes U+FFFD. Model text is raw bytes, and this vocabulary has single-byte
/// tokens for lead and continuation bytes alike, so sampled text can hold any sequence.
inline std::string json_string(std::string_view s) {
  using specdec::detail::utf8_character;
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t length = utf8_character(s, i);
    if (length == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else out.append(s.substr(i, length));
    i += length;
  }
  return out + "\"";
}

/// `s` as valid UTF-8: each byte that does not start a well-formed character becomes U+FFFD, as in json_string,
/// so the streamed text of a run reads as its JSON "text" does. Splitting `s` between two well-formed characters
/// changes nothing: pieces of specdec::llama::TextStream convert as their concatenation does.
inline std::string utf8_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t length = specdec::detail::utf8_character(s, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
      continue;
    }
    out.append(s.substr(i, length));
    i += length;
  }
  return out;
}

}  // namespace examples
