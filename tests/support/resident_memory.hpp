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

/// Whether reading memory that was never written leaves the resident set as it is. Not where the kernel's
/// transparent huge pages have their zero page switched off: a read then brings in a real 2 MiB page.
inline bool untouched_reads_are_free() {
  std::ifstream use_zero_page("/sys/kernel/mm/transparent_hugepage/use_zero_page");
  int on = 1;
  return !(use_zero_page >> on) || on != 0;
}

}  // namespace specdec::test
