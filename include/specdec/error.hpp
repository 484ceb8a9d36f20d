// specdec/error.hpp — the one exception type the library throws, and the one function that throws it.
// Entry point: specdec::Error. Read next: model.hpp.
#pragma once

#include <cassert>
#include <cstddef>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace specdec {

/// Every error the library reports. Messages are lowercase, name the thing that is wrong and give
/// expected vs found values, e.g. "draft vocabulary has 49152 tokens, target has 32000".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Bytes of the well-formed UTF-8 character at s[i] (Unicode's table 3-7: no overlong forms, no surrogates,
/// nothing above U+10FFFF), or 0. requires: i < s.size().
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

/// `text` with its control characters written as escapes (\n, \t, \r, else \xNN for each byte), so that a message
/// quoting a file's strings or a command line's arguments stays on one line and carries no escape sequence to a
/// terminal: the ASCII controls (0x00-0x1f, 0x7f), the C1 controls (U+0080-U+009F, whose U+009B a terminal may
/// take as the start of a sequence), and every byte that does not start a well-formed UTF-8 character. Other
/// characters pass as they are.
inline std::string escape_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto escape = [&out](unsigned char byte) {
    constexpr char hex[] = "0123456789abcdef";
    out += "\\x";
    out += hex[byte >> 4];
    out += hex[byte & 15];
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const std::size_t length = utf8_character(text, i);
    if (length == 0) {
      escape(byte);
      ++i;
      continue;
    }
    const bool c1 = byte == 0xC2 && static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (byte == '\n') out += "\\n";
    else if (byte == '\t') out += "\\t";
    else if (byte == '\r') out += "\\r";
    else if (byte < 0x20 || byte == 0x7f) escape(byte);
    else if (c1) {
      escape(byte);
      escape(static_cast<unsigned char>(text[i + 1]));
    } else out.append(text.substr(i, length));
    i += length;
  }
  return out;
}

/// Throws specdec::Error with the streamed concatenation of `parts`, its control bytes escaped (escape_controls).
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  throw Error(escape_controls(out.str()));
}

/// A floating-point value as text with every digit its type needs to be read back exactly (1.00000012, not
/// 1), for messages that quote a rejected value.
template <class T>
std::string exact(T value) {
  std::ostringstream out;
  out << std::setprecision(std::numeric_limits<T>::max_digits10) << value;
  return out.str();
}

}  // namespace detail
}  // namespace specdec

/// Internal invariant check, active in debug builds only (programming errors, not bad input).
#define SPECDEC_ASSERT(cond) assert(cond)
