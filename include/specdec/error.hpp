// specdec/error.hpp — the one exception type the library throws, and the one function that throws it.
// Entry point: specdec::Error. Read next: model.hpp.
#pragma once

#include <cassert>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace specdec {

/// Every error the library reports. Messages are lowercase, name the thing that is wrong and give
/// expected vs found values, e.g. "draft vocabulary has 49152 tokens, target has 32000".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Throws specdec::Error with the streamed concatenation of `parts`.
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  throw Error(out.str());
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
