// specdec/detail/huge_pages.hpp — big arrays in 2 MiB-aligned regions advised for transparent huge pages.
// Entry point: detail::HugePageAllocator (the KV cache; the reference model's transposed keys and, through
// llama/detail/huge_pages.hpp, its packed weights).
//
// An array that a forward pass streams through, tens of megabytes of weights or a kv head's keys and values,
// spans thousands of 4 KiB pages: the TLB misses on each and the hardware prefetcher stops at each page
// boundary. Backed by 2 MiB pages (Linux's transparent huge pages, which Debian enables for regions that ask
// with madvise) the same reads go faster. Elsewhere, or when the kernel has no huge page to give, the memory is
// ordinary memory: only speed differs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace specdec::detail {

inline constexpr std::size_t huge_page = std::size_t{2} << 20;

/// Advises the kernel to back the whole 2 MiB pages inside [p, p + bytes) with huge pages. Call it before the
/// memory is first written: pages already touched are only merged later, if at all.
inline void advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + huge_page - 1) / huge_page * huge_page;
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) / huge_page * huge_page;
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice only
#else
  (void)p;
  (void)bytes;
#endif
}

/// `bytes` rounded up to whole huge pages, 2 MiB-aligned and advised for huge pages, not yet written; release
/// with std::free.
inline void* allocate_huge_pages(std::size_t bytes) {
  const std::size_t rounded = (bytes + huge_page - 1) / huge_page * huge_page;
  void* p = std::aligned_alloc(huge_page, rounded);
  if (p == nullptr) throw std::bad_alloc();
  advise_huge_pages(p, rounded);
  return p;
}

/// std::allocator for big arrays: allocations of 2 MiB or more are 2 MiB-aligned and advised for huge pages.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT(google-explicit-constructor): allocator rebind
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_page) return std::allocator<T>().allocate(n);
    return static_cast<T*>(allocate_huge_pages(bytes));
  }
  void deallocate(T* p, std::size_t n) {
    if (n * sizeof(T) < huge_page) return std::allocator<T>().deallocate(p, n);
    std::free(p);
  }
  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) { return true; }
};

}  // namespace specdec::detail
