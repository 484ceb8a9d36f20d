// specdec/llama/detail/huge_pages.hpp — memory for the packed weights that every forward pass streams, in
// 2 MiB-aligned regions advised for transparent huge pages (the allocator itself is the core's, in
// ../../detail/huge_pages.hpp).
// Entry point: detail::arena_bytes (packed weights); HugePageAllocator is re-exported for the benchmarks.
//
// A forward pass reads about 100 MB of weights. With 4 KiB pages that is 25,000 pages per pass: the TLB
// misses on each and the hardware prefetcher stops at each page boundary. Backed by 2 MiB pages, a
// single-position forward measured about 10% faster on the reference machine.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "specdec/detail/huge_pages.hpp"

namespace specdec::llama::detail {

using specdec::detail::allocate_huge_pages;
using specdec::detail::huge_page;
using specdec::detail::HugePageAllocator;

/// A zeroed, 2 MiB-aligned region of at least `bytes` bytes, advised for huge pages.
inline std::shared_ptr<std::byte> huge_page_bytes_block(std::size_t bytes) {
  auto* p = static_cast<std::byte*>(allocate_huge_pages(bytes));
  std::memset(p, 0, bytes);
  return {p, [](std::byte* q) { std::free(q); }};
}

/// `bytes` zeroed bytes, 64-byte aligned, carved from shared 8 MiB huge-page chunks (so that many small
/// matrices share huge pages); a region of its own when bigger than a quarter chunk. The result keeps its
/// chunk alive. The last chunk stays reserved for later requests until the process ends. Thread-safe.
inline std::shared_ptr<std::byte> arena_bytes(std::size_t bytes) {
  constexpr std::size_t chunk_bytes = 4 * huge_page;
  bytes = (bytes + 63) / 64 * 64;
  if (bytes > chunk_bytes / 4) return huge_page_bytes_block(bytes);
  static std::mutex mutex;
  static std::shared_ptr<std::byte> chunk;
  static std::size_t used = chunk_bytes;
  const std::lock_guard lock(mutex);
  if (used + bytes > chunk_bytes) {
    chunk = huge_page_bytes_block(chunk_bytes);
    used = 0;
  }
  std::shared_ptr<std::byte> slice(chunk, chunk.get() + used);  // shares the chunk's ownership
  used += bytes;
  return slice;
}

}  // namespace specdec::llama::detail
