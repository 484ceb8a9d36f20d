#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include <specdec/kv_cache.hpp>

#if defined(__linux__)
#include "support/resident_memory.hpp"
#endif

using specdec::KvCache;

namespace {
KvCache::Rows rows_from(int first, int count, int width) {
  KvCache::Rows r(count, width);
  for (int i = 0; i < count; ++i)
    for (int j = 0; j < width; ++j) r(i, j) = static_cast<float>(100 * (first + i) + j);
  return r;
}
}  // namespace

TEST_CASE("kv cache appends rows per layer and views the first n", "[kv_cache]") {
  KvCache cache(2, 8, 3);
  CHECK(cache.size() == 0);
  cache.append(0, rows_from(0, 3, 3), rows_from(50, 3, 3));
  CHECK(cache.size(0) == 3);
  CHECK(cache.size() == 0);  // layer 1 holds nothing yet
  cache.append(1, rows_from(10, 3, 3), rows_from(60, 3, 3));
  cache.append(0, rows_from(3, 2, 3), rows_from(53, 2, 3));
  cache.append(1, rows_from(13, 2, 3), rows_from(63, 2, 3));
  CHECK(cache.size() == 5);
  CHECK(cache.keys(0, 5) == rows_from(0, 5, 3));
  CHECK(cache.values(0, 5) == rows_from(50, 5, 3));
  CHECK(cache.keys(1, 2) == rows_from(10, 2, 3));
}

TEST_CASE("kv cache truncate keeps the prefix and later appends overwrite the rest", "[kv_cache]") {
  KvCache cache(1, 6, 2);
  cache.append(0, rows_from(0, 5, 2), rows_from(0, 5, 2));
  cache.truncate(2);
  CHECK(cache.size() == 2);
  cache.truncate(4);  // growing is a no-op
  CHECK(cache.size() == 2);
  cache.append(0, rows_from(7, 2, 2), rows_from(8, 2, 2));
  KvCache::Rows expected(4, 2);
  expected << rows_from(0, 2, 2), rows_from(7, 2, 2);
  CHECK(cache.keys(0, 4) == expected);
  const auto start = cache.reserve(0, 1);
  CHECK(start == 4);
  cache.key_rows(0, start, 1).setConstant(9.0f);
  CHECK(cache.keys(0, 5)(4, 1) == 9.0f);
  cache.clear();
  CHECK(cache.size() == 0);
}

TEST_CASE("kv cache reports overflow and bad arguments as specdec::Error", "[kv_cache][errors]") {
  KvCache cache(2, 4, 2);
  cache.append(0, rows_from(0, 3, 2), rows_from(0, 3, 2));
  CHECK_THROWS_WITH(cache.append(0, rows_from(0, 2, 2), rows_from(0, 2, 2)),
                    "kv cache overflow: layer 0 holds 3 of 4 positions, cannot append 2 more");
  CHECK(cache.size(0) == 3);  // a failed append changes nothing
  CHECK_THROWS_WITH(cache.append(2, rows_from(0, 1, 2), rows_from(0, 1, 2)), "kv cache has 2 layers, got layer 2");
  CHECK_THROWS_WITH(cache.append(1, rows_from(0, 1, 3), rows_from(0, 1, 3)),
                    "kv cache append expects keys and values of [rows, 2], got [1, 3] and [1, 3]");
  CHECK_THROWS_WITH(cache.keys(1, 1), "kv cache layer 1 holds 0 positions, asked for 1");
  CHECK_THROWS_WITH(KvCache(0, 4, 2), "kv cache needs layers, capacity and width > 0, got 0, 4, 2");
  CHECK_THROWS_WITH(cache.size(2), "kv cache has 2 layers, got layer 2");
  // Rows for writing in place must lie inside the layer's capacity, in every build (not only under assert).
  CHECK_THROWS_WITH(cache.key_rows(0, 2, 10), "kv cache rows [2, 2 + 10) of layer 0 are outside its 4 positions");
  CHECK_THROWS_WITH(cache.value_rows(1, -1, 1), "kv cache rows [-1, -1 + 1) of layer 1 are outside its 4 positions");
  CHECK_THROWS_WITH(cache.value_rows(1, 5, 0), "kv cache rows [5, 5 + 0) of layer 1 are outside its 4 positions");
  CHECK_THROWS_WITH(cache.key_rows(1, 0, -2), "kv cache rows [0, 0 + -2) of layer 1 are outside its 4 positions");
  CHECK_THROWS_WITH(cache.key_rows(2, 0, 1), "kv cache has 2 layers, got layer 2");
  CHECK(cache.key_rows(1, 1, 3).rows() == 3);
  CHECK(cache.value_rows(1, 4, 0).rows() == 0);
}

#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer's operator new aborts where it would throw std::bad_alloc
TEST_CASE("kv cache reports memory it cannot get as specdec::Error", "[kv_cache][errors]") {
  // 2^46 float rows: 256 TiB, more than a 64-bit Linux process can map whatever the overcommit setting.
  CHECK_THROWS_WITH(KvCache(1, std::size_t{1} << 46, 1),
                    "kv cache of 1 layers x 70368744177664 positions x 1 values (562949953421312 bytes of keys and "
                    "values) could not be allocated");
}
#endif

TEST_CASE("kv cache stores any element type, such as half-precision bit patterns", "[kv_cache]") {
  using HalfCache = specdec::BasicKvCache<std::uint16_t>;
  HalfCache cache(1, 4, 2);
  HalfCache::Rows keys(3, 2), values(3, 2);
  keys << 0x3C00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600;  // 1..6 in half precision
  values = keys.array() + std::uint16_t{1};
  cache.append(0, keys, values);
  cache.truncate(2);
  CHECK(cache.size() == 2);
  CHECK(cache.keys(0, 2) == keys.topRows(2));
  CHECK(cache.values(0, 2) == values.topRows(2));
  CHECK_THROWS_WITH(cache.append(0, keys, values), "kv cache overflow: layer 0 holds 2 of 4 positions, cannot append 3 more");
}

TEST_CASE("kv cache layers of several megabytes live in one array each for keys and values", "[kv_cache]") {
  // 3 layers x 65536 positions x 4 floats: 3 MiB of keys, past the 2 MiB from which the storage asks for huge
  // pages; the layers must still not overlap, and a copy must not share storage with its source.
  KvCache cache(3, 65536, 4);
  for (std::size_t layer = 0; layer < 3; ++layer) {
    const auto start = cache.reserve(layer, 65536);
    cache.key_rows(layer, start, 65536).setConstant(static_cast<float>(layer + 1));
    cache.value_rows(layer, start, 65536).setConstant(-static_cast<float>(layer + 1));
  }
  for (std::size_t layer = 0; layer < 3; ++layer) {
    CHECK((cache.keys(layer, 65536).array() == static_cast<float>(layer + 1)).all());
    CHECK((cache.values(layer, 65536).array() == -static_cast<float>(layer + 1)).all());
  }
  KvCache copy = cache;
  copy.key_rows(1, 65535, 1).setConstant(9.0f);
  CHECK(copy.keys(1, 65536)(65535, 3) == 9.0f);
  CHECK(cache.keys(1, 65536)(65535, 3) == 2.0f);
  CHECK(cache.keys(2, 1)(0, 0) == 3.0f);
}

TEST_CASE("kv cache refuses a size that its bytes cannot count", "[kv_cache]") {
  const std::size_t huge = std::size_t{1} << 40;
  CHECK_THROWS_WITH(KvCache(huge, huge, 1),
                    "kv cache of 1099511627776 layers x 1099511627776 positions x 1 values is too large");
}

#if defined(__linux__)
TEST_CASE("kv cache positions never written take no memory and read as zeros", "[kv_cache]") {
  // 4 layers x 2^20 positions x 64 floats: 1 GiB of keys and 1 GiB of values, of which one position a layer
  // is written. Zero-filling them up front (as std::vector does) made the resident set grow by the 2 GiB.
  const std::size_t before = specdec::test::resident_bytes();
  KvCache cache(4, std::size_t{1} << 20, 64);
  for (std::size_t layer = 0; layer < 4; ++layer) cache.append(layer, rows_from(1, 1, 64), rows_from(2, 1, 64));
  const std::size_t after = specdec::test::resident_bytes();
  REQUIRE(before > 0);
  CHECK(after < before + (std::size_t{64} << 20));  // 8 huge pages touched: 16 MiB
  CHECK(cache.keys(3, 1) == rows_from(1, 1, 64));
  CHECK((cache.key_rows(2, 1, 4096).array() == 0.0f).all());
  CHECK((cache.value_rows(0, (1 << 20) - 1, 1).array() == 0.0f).all());
  // A copy holds the same rows and, like the original, takes memory only for the pieces that are not zeros
  // (a copy of every element made the resident set grow by the 2 GiB, to 2.17 GB).
  const std::size_t before_copy = specdec::test::resident_bytes();
  KvCache copy = cache;  // reads every page of `cache`
  if (specdec::test::untouched_reads_are_free())
    CHECK(specdec::test::resident_bytes() < before_copy + (std::size_t{64} << 20));
  CHECK(copy.keys(3, 1) == rows_from(1, 1, 64));
  CHECK(copy.values(0, 1) == rows_from(2, 1, 64));
  CHECK((copy.key_rows(1, 1, 4096).array() == 0.0f).all());
  copy.truncate(0);
  copy.append(0, rows_from(3, 1, 64), rows_from(4, 1, 64));
  CHECK(cache.keys(0, 1) == rows_from(1, 1, 64));  // the copy's rows are its own
  KvCache moved = std::move(cache);
  CHECK(moved.values(3, 1) == rows_from(2, 1, 64));
}
#endif

TEST_CASE("huge-page allocations whose size wraps when rounded or multiplied throw std::bad_alloc", "[kv_cache]") {
  // Within 2 MiB of SIZE_MAX, rounding up to whole huge pages wraps to a few bytes; n * sizeof(T) wraps too.
  CHECK_THROWS_AS(specdec::detail::allocate_huge_pages(SIZE_MAX - 100), std::bad_alloc);
  CHECK_THROWS_AS(specdec::detail::allocate_zeroed_pages(SIZE_MAX - 100), std::bad_alloc);
  // 2^62 + 2^19 floats: n * 4 wraps to exactly one huge page, which allocate_huge_pages would hand out.
  const std::size_t wraps_to_huge_page = SIZE_MAX / 4 + 1 + specdec::detail::huge_page / 4;
  CHECK_THROWS_AS(specdec::detail::HugePageAllocator<float>().allocate(wraps_to_huge_page), std::bad_alloc);
  void* p = specdec::detail::allocate_huge_pages(100);  // one huge page, 2 MiB-aligned
  CHECK(reinterpret_cast<std::uintptr_t>(p) % specdec::detail::huge_page == 0);
  std::free(p);
}
