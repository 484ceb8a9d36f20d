// specdec/error.hpp — the one exception type the library throws, and the one function that throws it.
// Entry point: specdec::Error. Read next: model.hpp.
#pragma once

#include <cassert>
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

/// `text` with its ASCII control bytes (0x00-0x1f and 0x7f) written as escapes (\n, \t, \r, \xNN), so that a
/// message quoting a file's strings or a command line's arguments stays on one line and carries no ASCII escape
/// sequence to a terminal. Other bytes pass as they are.
inline std::string escape_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[byte >> 4];
      out += hex[byte & 15];
    }
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
