// specdec/detail/huge_pages.hpp — big arrays in 2 MiB-aligned regions advised for transparent huge pages.
// Entry points: detail::ZeroedArray (the KV cache, the reference model's transposed keys and q8 scales: zeros
// that cost nothing until written), detail::allocate_huge_pages (through llama/detail/huge_pages.hpp, the
// packed weights) and detail::HugePageAllocator (the benchmarks' buffers).
//
// An array that a forward pass streams through, tens of megabytes of weights or a kv head's keys and values,
// spans thousands of 4 KiB pages: the TLB misses on each and the hardware prefetcher stops at each page
// boundary. Backed by 2 MiB pages (Linux's transparent huge pages, which Debian enables for regions that ask
// with madvise) the same reads go faster. Elsewhere, or when the kernel has no huge page to give, the memory is
// ordinary memory: only speed differs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace specdec::detail {

inline constexpr std::size_t huge_page = std::size_t{2} << 20;

/// x rounded up to a multiple of huge_page (an address or a size; 0 where that wraps around).
inline constexpr std::uintptr_t round_up_to_huge_page(std::uintptr_t x) {
  return (x + huge_page - 1) / huge_page * huge_page;
}

/// Advises the kernel to back the whole 2 MiB pages inside [p, p + bytes) with huge pages. Call it before the
/// memory is first written: pages already touched are only merged later, if at all.
inline void advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const auto begin = round_up_to_huge_page(reinterpret_cast<std::uintptr_t>(p));
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
  const std::size_t rounded = round_up_to_huge_page(bytes);
  if (rounded < bytes) throw std::bad_alloc();  // within 2 MiB of SIZE_MAX: rounding wrapped
  void* p = std::aligned_alloc(huge_page, rounded);
  if (p == nullptr) throw std::bad_alloc();
  advise_huge_pages(p, rounded);
  return p;
}

/// `bytes` of zeros, rounded up to whole huge pages, 2 MiB-aligned and advised for huge pages; release with
/// release_zeroed_pages(p, bytes). On Linux they are fresh anonymous pages, which the kernel zeroes when each
/// is first touched (a whole 2 MiB page where it has one to give), so memory that is never written costs
/// neither time nor resident memory (a KV cache sized for a long context); elsewhere they are written with
/// zeros here. requires: bytes > 0.
inline void* allocate_zeroed_pages(std::size_t bytes) {
  const std::size_t rounded = round_up_to_huge_page(bytes);
  if (bytes == 0 || rounded < bytes || rounded > SIZE_MAX - huge_page) throw std::bad_alloc();
#if defined(__linux__)
  // Map one huge page more than asked and unmap the ends around the 2 MiB-aligned part.
  void* mapped = mmap(nullptr, rounded + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(mapped);
  const auto aligned = round_up_to_huge_page(start);
  if (aligned > start) (void)munmap(mapped, aligned - start);
  if (const std::size_t tail = start + huge_page - aligned; tail > 0)
    (void)munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  advise_huge_pages(reinterpret_cast<void*>(aligned), rounded);
  return reinterpret_cast<void*>(aligned);
#else
  void* p = allocate_huge_pages(rounded);
  std::memset(p, 0, rounded);
  return p;
#endif
}

/// Releases what allocate_zeroed_pages(bytes) returned.
inline void release_zeroed_pages(void* p, std::size_t bytes) {
#if defined(__linux__)
  (void)munmap(p, round_up_to_huge_page(bytes));
#else
  (void)bytes;
  std::free(p);
#endif
}

/// std::allocator for big arrays: allocations of 2 MiB or more are 2 MiB-aligned and advised for huge pages.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT(google-explicit-constructor): allocator rebind
  T* allocate(std::size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
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

/// Copies the 4 KiB pieces of `from` that hold a non-zero byte to `to`, whose `bytes` bytes are all zero: a
/// piece of zeros is only read (on Linux an untouched page reads as the shared zero page, taking no memory), so
/// the copy takes memory for what `from` holds, not for its size.
inline void copy_nonzero_pieces(const void* from, void* to, std::size_t bytes) {
  constexpr std::size_t piece = 4096;
  alignas(64) static constexpr unsigned char zeros[piece] = {};
  const auto* src = static_cast<const unsigned char*>(from);
  auto* dst = static_cast<unsigned char*>(to);
  for (std::size_t at = 0; at < bytes; at += piece) {
    const std::size_t n = std::min(piece, bytes - at);
    if (std::memcmp(src + at, zeros, n) != 0) std::memcpy(dst + at, src + at, n);
  }
}

/// A fixed-size array of numbers that starts as zeros, in memory from allocate_zeroed_pages from 2 MiB up: on
/// Linux a page costs time and resident memory only once something is written to it, so a KV cache sized for a
/// context far longer than it will hold costs what it holds, in 2 MiB pages. (std::vector's value-initialisation
/// writes every element.) A copy is lazy in the same way: it writes only what is not zero (copy_nonzero_pieces).
template <class T>
class ZeroedArray {
  static_assert(std::is_arithmetic_v<T>, "ZeroedArray holds numbers, whose all-zero bytes are the value 0");

 public:
  ZeroedArray() = default;
  /// `count` zeros. Throws std::bad_alloc where the memory cannot be had.
  explicit ZeroedArray(std::size_t count) : size_(count) {
    if (count == 0) return;
    if (count > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    if (bytes() >= huge_page) {
      data_ = static_cast<T*>(allocate_zeroed_pages(bytes()));
    } else {
      data_ = static_cast<T*>(::operator new(bytes(), std::align_val_t{64}));
      std::memset(static_cast<void*>(data_), 0, bytes());
    }
  }
  ZeroedArray(const ZeroedArray& other) : ZeroedArray(other.size_) {
    if (size_ == 0) return;
    if (bytes() >= huge_page) copy_nonzero_pieces(other.data_, data_, bytes());  // the rest is zeros already
    else std::memcpy(static_cast<void*>(data_), other.data_, bytes());
  }
  ZeroedArray(ZeroedArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  ZeroedArray& operator=(ZeroedArray other) noexcept {  // copy or move, then swap
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~ZeroedArray() {
    if (data_ == nullptr) return;
    if (bytes() >= huge_page) release_zeroed_pages(data_, bytes());
    else ::operator delete(static_cast<void*>(data_), std::align_val_t{64});
  }

  std::size_t size() const { return size_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  std::size_t bytes() const { return size_ * sizeof(T); }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace specdec::detail
