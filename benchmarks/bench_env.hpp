// benchmarks/bench_env.hpp — the benchmarks' settings from environment variables, checked: a value that is not
// what the variable takes ends the run with a message naming the variable and the value (each benchmark's main
// prints it and exits with status 2), never std::terminate or a silently different setting.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace specdec::bench {

/// The value of environment variable `name`, or `fallback` where it is unset or empty.
inline std::string env_text(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

/// `text` as a whole number in [min, max] (decimal digits only: no sign, space or suffix); throws
/// std::invalid_argument naming `what` and `text` otherwise.
inline std::size_t parse_count(const std::string& text, const std::string& what, std::size_t min, std::size_t max) {
  const auto fail = [&]() -> std::size_t {
    throw std::invalid_argument(what + " '" + text + "' is not a whole number from " + std::to_string(min) + " to " +
                                std::to_string(max));
  };
  if (text.empty() || text.size() > 18) return fail();
  std::size_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return fail();
    value = value * 10 + static_cast<std::size_t>(c - '0');
  }
  return value < min || value > max ? fail() : value;
}

/// Environment variable `name` as a whole number in [min, max], or `fallback` where it is unset or empty.
inline std::size_t env_count(const char* name, std::size_t fallback, std::size_t min, std::size_t max) {
  const std::string text = env_text(name, "");
  return text.empty() ? fallback : parse_count(text, name, min, max);
}

}  // namespace specdec::bench
