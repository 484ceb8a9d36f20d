// examples/json_text.hpp — JSON string literals of model text for specdec-generate's --json output.
// Entry point: examples::json_string. Model text is raw bytes and need not be valid UTF-8.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace examples {

/// Bytes of the well-formed UTF-8 character at s[i] (Unicode's table 3-7: no overlong forms, no surrogates,
/// nothing above U+10FFFF), or 0. Model text is raw bytes, and this vocabulary has single-byte tokens for lead and
/// continuation bytes alike, so sampled text can hold any sequence.
inline std::size_t utf8_character(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  const std::size_t length = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (length == 0 || i + length > s.size()) return 0;
  const auto second = static_cast<unsigned char>(s[i + 1]);
  // The second byte's range narrows after E0 (no overlong), ED (no surrogates), F0 (no overlong), F4 (<= 10FFFF).
  const unsigned char low = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
  const unsigned char high = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  if (second < low || second > high) return 0;
  for (std::size_t j = 2; j < length; ++j)
    if ((static_cast<unsigned char>(s[i + j]) & 0xC0) != 0x80) return 0;
  return length;
}

/// JSON string literal of UTF-8 text; each byte that does not start a well-formed character becomes U+FFFD.
inline std::string json_string(std::string_view s) {
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

}  // namespace examples
