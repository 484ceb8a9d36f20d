// specdec/kv_cache.hpp — fixed-capacity per-layer key/value storage with rollback in O(layers), no copy.
// Entry point: specdec::KvCache. A Model implements truncate(n) with KvCache::truncate(n).
// Read next: model.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>
#include <vector>

#include "specdec/detail/eigen_core.hpp"
#include "specdec/detail/huge_pages.hpp"
#include "specdec/error.hpp"

namespace specdec {

/// Key and value rows for each layer of a transformer, one row per position, in fixed-capacity
/// row-major matrices allocated once. Rollback (truncate) only moves lengths: O(layers), no copy.
/// Scalar is the stored element: float (KvCache), or a compact encoding a model converts itself (the llama
/// model keeps IEEE half-precision bit patterns, std::uint16_t, to halve the bytes attention reads, or 8-bit
/// integers, std::int8_t, with row scales it keeps beside the cache).
/// All layers' keys are one array and all values another, backed by huge pages from 2 MiB up (see
/// detail/huge_pages.hpp), where each layer was an Eigen matrix of its own in 4 KiB pages: attention reads a
/// layer's values from memory at every step. The reference model's forwards of one position at context 256
/// took 0.98-0.99x the time (2 threads, 2026-12-02; no gain at context 2000, 0.975-1.0x at 5 positions).
/// The arrays start as zeros that, on Linux, take no memory or time until written (detail::ZeroedArray): a cache
/// sized for a long context costs what it holds, rounded up to 2 MiB pages in each layer's keys and values.
template <class Scalar>
class BasicKvCache {
 public:
  using Rows = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;  // [capacity, width]
  using RowsView = Eigen::Map<const Rows>;  // [n, width] rows of one layer
  using MutableRowsView = Eigen::Map<Rows>;

  BasicKvCache() = default;

  /// requires: layers > 0, capacity > 0, width > 0.
  BasicKvCache(std::size_t layers, std::size_t capacity, std::size_t width)
      : capacity_(capacity), width_(width) {
    if (layers == 0 || capacity == 0 || width == 0)
      detail::fail("kv cache needs layers, capacity and width > 0, got ", layers, ", ", capacity, ", ", width);
    // A layer's rows are viewed as one Eigen map, indexed by a signed Eigen::Index: a capacity past what its
    // bytes can count would turn negative there; and all layers' bytes must be countable in a std::size_t.
    constexpr auto max_bytes = static_cast<std::size_t>(std::numeric_limits<Eigen::Index>::max());
    if (capacity > max_bytes / width / sizeof(Scalar))
      detail::fail("kv cache of ", capacity, " positions x ", width, " values per layer is too large to address");
    if (layers > std::numeric_limits<std::size_t>::max() / sizeof(Scalar) / (capacity * width))
      detail::fail("kv cache of ", layers, " layers x ", capacity, " positions x ", width, " values is too large");
    lengths_.assign(layers, 0);
    try {
      keys_ = Storage(layers * capacity * width);  // zeros; on Linux no page is touched until written
      values_ = Storage(layers * capacity * width);
    } catch (const std::bad_alloc&) {
      detail::fail("kv cache of ", layers, " layers x ", capacity, " positions x ", width, " values (",
                   2 * layers * capacity * width * sizeof(Scalar), " bytes of keys and values) could not be allocated");
    }
  }

  std::size_t layers() const { return lengths_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t width() const { return width_; }

  /// Positions held by every layer (the smallest layer length).
  std::size_t size() const {
    return lengths_.empty() ? 0 : *std::min_element(lengths_.begin(), lengths_.end());
  }
  /// Positions held by one layer.
  std::size_t size(std::size_t layer) const {
    check_layer(layer);
    return lengths_[layer];
  }

  /// Appends rows to one layer. requires: keys and values are [rows, width()].
  /// Throws specdec::Error when the layer would exceed capacity().
  void append(std::size_t layer, const Eigen::Ref<const Rows>& keys, const Eigen::Ref<const Rows>& values) {
    check_layer(layer);
    if (keys.rows() != values.rows() || keys.cols() != static_cast<Eigen::Index>(width_) ||
        values.cols() != static_cast<Eigen::Index>(width_))
      detail::fail("kv cache append expects keys and values of [rows, ", width_, "], got [", keys.rows(), ", ",
                   keys.cols(), "] and [", values.rows(), ", ", values.cols(), "]");
    const auto start = reserve(layer, static_cast<std::size_t>(keys.rows()));
    key_rows(layer, start, keys.rows()) = keys;
    value_rows(layer, start, values.rows()) = values;
  }

  /// Grows one layer by `rows` positions and returns the row index where they start, so a model can write
  /// keys and values in place (see key_rows/value_rows). Throws specdec::Error on overflow.
  Eigen::Index reserve(std::size_t layer, std::size_t rows) {
    check_layer(layer);
    if (rows > capacity_ - lengths_[layer])
      detail::fail("kv cache overflow: layer ", layer, " holds ", lengths_[layer], " of ", capacity_,
                   " positions, cannot append ", rows, " more");
    const auto start = static_cast<Eigen::Index>(lengths_[layer]);
    lengths_[layer] += rows;
    return start;
  }

  /// The first n key rows of a layer: [n, width()]. requires: n <= size(layer).
  RowsView keys(std::size_t layer, std::size_t n) const { return view(keys_, layer, n); }
  /// The first n value rows of a layer: [n, width()]. requires: n <= size(layer).
  RowsView values(std::size_t layer, std::size_t n) const { return view(values_, layer, n); }

  /// Writable rows [start, start + n) of a layer, for in-place writes after reserve(). Throws specdec::Error
  /// where they reach outside the layer's capacity().
  MutableRowsView key_rows(std::size_t layer, Eigen::Index start, Eigen::Index n) { return rows(keys_, layer, start, n); }
  MutableRowsView value_rows(std::size_t layer, Eigen::Index start, Eigen::Index n) {
    return rows(values_, layer, start, n);
  }

  /// Keeps the first n positions of every layer and drops the rest, in O(layers); a layer holding n or fewer
  /// keeps all of its own (so truncate(size()) evens out layers that a failed step left at different lengths).
  void truncate(std::size_t n) {
    for (auto& length : lengths_) length = std::min(length, n);
  }
  void clear() { truncate(0); }

 private:
  using Storage = detail::ZeroedArray<Scalar>;

  void check_layer(std::size_t layer) const {
    if (layer >= lengths_.size()) detail::fail("kv cache has ", lengths_.size(), " layers, got layer ", layer);
  }
  RowsView view(const Storage& all, std::size_t layer, std::size_t n) const {
    check_layer(layer);
    if (n > lengths_[layer])
      detail::fail("kv cache layer ", layer, " holds ", lengths_[layer], " positions, asked for ", n);
    return RowsView(&all[layer * capacity_ * width_], static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(width_));
  }
  MutableRowsView rows(Storage& all, std::size_t layer, Eigen::Index start, Eigen::Index n) {
    check_layer(layer);
    if (start < 0 || n < 0 || static_cast<std::size_t>(start) > capacity_ ||
        static_cast<std::size_t>(n) > capacity_ - static_cast<std::size_t>(start))
      detail::fail("kv cache rows [", start, ", ", start, " + ", n, ") of layer ", layer, " are outside its ",
                   capacity_, " positions");
    return MutableRowsView(&all[(layer * capacity_ + static_cast<std::size_t>(start)) * width_], n,
                           static_cast<Eigen::Index>(width_));
  }

  std::size_t capacity_ = 0;
  std::size_t width_ = 0;
  Storage keys_;                      // [layers, capacity, width]
  Storage values_;                    // [layers, capacity, width]
  std::vector<std::size_t> lengths_;  // per layer: positions held
};

/// The float cache.
using KvCache = BasicKvCache<float>;

}  // namespace specdec
