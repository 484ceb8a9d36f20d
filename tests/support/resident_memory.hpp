// tests/support/resident_memory.hpp — this process's resident set, for tests of memory that must not be touched.
#pragma once

#include <cstddef>
#include <fstream>

#include <unistd.h>

namespace specdec::test {

/// Bytes of this process's resident set now, from /proc/self/statm (Linux only); 0 where it cannot be read.
inline std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace specdec::test
