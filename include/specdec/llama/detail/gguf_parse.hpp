// specdec/llama/detail/gguf_parse.hpp — File::parse: the GGUF header read and checked in one pass.
// Entry point: gguf::File::parse (called by File's constructor). Read first: ../gguf.hpp, which includes this
// file after the File class.
//
// Every count, length, offset and size is checked against the bytes that remain before it is used (Cursor), and
// overflow is checked on every product and sum of sizes, so that a malformed file gives a specdec::Error naming the
// file, the key or tensor and expected vs found.
#pragma once

#include "specdec/llama/gguf.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace specdec::gguf {
namespace detail {

/// Sequential, bounds-checked reads over the file bytes; failures name the file and the current item.
class Cursor {
 public:
  Cursor(const std::string& file, std::span<const std::byte> bytes) : file_(file), bytes_(bytes) {}

  std::size_t pos() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  /// Names the item being read ("key 'x'", "tensor 'y'", "tensor 3") in error messages.
  void set_item(std::string_view kind, std::string_view name) { kind_ = kind, name_ = name, index_.reset(); }
  void set_item(std::string_view kind, std::uint64_t index) { kind_ = kind, name_ = {}, index_ = index; }
  std::string item() const {
    if (index_) return std::string(kind_) + " " + std::to_string(*index_);
    return name_.empty() ? std::string(kind_) : std::string(kind_) + " '" + std::string(name_) + "'";
  }

  const std::byte* take(std::uint64_t n, std::string_view field) {
    if (n > remaining()) {
      specdec::detail::fail(file_, ": ", item(), ": ", field, " of ", n, " bytes at byte ", pos_,
                            " runs past the end of the file (", bytes_.size(), " bytes)");
    }
    const std::byte* p = bytes_.data() + pos_;
    pos_ += std::size_t(n);
    return p;
  }
  std::uint32_t u32(std::string_view field) { return load<std::uint32_t>(take(4, field)); }
  std::uint64_t u64(std::string_view field) { return load<std::uint64_t>(take(8, field)); }
  std::string_view str(std::string_view field) {
    const std::uint64_t n = u64(field);
    const std::byte* p = take(n, field);
    return {reinterpret_cast<const char*>(p), std::size_t(n)};
  }
  /// Fails unless `count` items of at least `min_size` bytes each can fit in what remains.
  void check_count(std::uint64_t count, std::size_t min_size, std::string_view what) {
    if (count > remaining() / min_size) {
      specdec::detail::fail(file_, ": ", item(), ": ", what, " count ", count, " needs at least ",
                            min_size, " bytes each, only ", remaining(), " bytes remain at byte ", pos_);
    }
  }

 private:
  const std::string& file_;
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
  std::string_view kind_ = "header", name_;  // views of the file or of literals
  std::optional<std::uint64_t> index_;
};

/// a * b and a + b, or nullopt on uint64 overflow.
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

}  // namespace detail

inline void File::parse() {
  using specdec::detail::fail;
  detail::Cursor in(name_, storage_->bytes());
  const std::byte* magic = in.take(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    fail(name_, ": bad magic 0x", std::hex, detail::load<std::uint32_t>(magic), std::dec,
         ", expected 0x46554747 (\"GGUF\")");
  }
  version_ = in.u32("version");
  if ((version_ & 0xFFFFu) == 0 && version_ != 0)
    fail(name_, ": version ", version_, " looks byte-swapped; big-endian gguf files are not supported");
  if (version_ < 2 || version_ > 3) fail(name_, ": unsupported gguf version ", version_, ", expected 2 or 3");
  const std::uint64_t tensor_count = in.u64("tensor count");
  const std::uint64_t kv_count = in.u64("metadata count");
  // Smallest metadata entry: key length (8) + 1-byte key + type (4) + 1-byte value. Smallest tensor
  // info: name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
  in.check_count(kv_count, 14, "metadata");
  in.check_count(tensor_count, 32, "tensor");

  keys_.reserve(std::size_t(kv_count));
  values_.reserve(std::size_t(kv_count));
  for (std::uint64_t i = 0; i < kv_count; ++i) {
    in.set_item("metadata entry", i);
    const std::string_view key = in.str("key");
    if (key.empty()) fail(name_, ": metadata entry ", i, " has an empty key");
    in.set_item("key", key);
    detail::Value v{};
    parse_value(in, v, key);
    if (!values_.emplace(key, v).second) fail(name_, ": duplicate key '", key, "'");
    keys_.push_back(key);
  }

  if (auto t = type_of("general.alignment")) {
    if (*t != ValueType::UINT32)
      fail(name_, ": key 'general.alignment' has type ", value_type_name(*t), ", expected uint32");
    const auto a = std::uint32_t(get_uint("general.alignment"));
    if (a == 0 || (a & (a - 1)) != 0)
      fail(name_, ": key 'general.alignment' is ", a, ", expected a power of two");
    alignment_ = a;
  }

  tensors_.reserve(std::size_t(tensor_count));
  tensor_index_.reserve(std::size_t(tensor_count));
  for (std::uint64_t i = 0; i < tensor_count; ++i) parse_tensor_info(in);
  place_tensors(in.pos());
}

inline void File::parse_value(detail::Cursor& in, detail::Value& v, std::string_view key) {
  using specdec::detail::fail;
  const std::uint32_t type = in.u32("value type");
  if (type > std::uint32_t(ValueType::FLOAT64))
    fail(name_, ": key '", key, "' has unknown value type ", type, ", expected 0 to 12");
  v.type = ValueType(type);
  if (v.type == ValueType::STRING) {
    const std::string_view s = in.str("string");
    v.raw = {reinterpret_cast<const std::byte*>(s.data()), s.size()};
    return;
  }
  if (v.type != ValueType::ARRAY) {
    v.raw = {in.take(detail::scalar_size(v.type), value_type_name(v.type)), detail::scalar_size(v.type)};
    if (v.type == ValueType::BOOL && std::to_integer<unsigned>(v.raw[0]) > 1)
      fail(name_, ": key '", key, "' bool value is ", std::to_integer<unsigned>(v.raw[0]), ", expected 0 or 1");
    return;
  }
  const std::uint32_t element = in.u32("array element type");
  if (element == std::uint32_t(ValueType::ARRAY)) fail(name_, ": key '", key, "': nested arrays are not supported");
  if (element > std::uint32_t(ValueType::FLOAT64))
    fail(name_, ": key '", key, "' has unknown array element type ", element, ", expected 0 to 12");
  v.element_type = ValueType(element);
  v.count = in.u64("array length");
  const std::size_t start = in.pos();
  if (v.element_type == ValueType::STRING) {
    in.check_count(v.count, 8, "array element");
    for (std::uint64_t i = 0; i < v.count; ++i) in.str("array string");
  } else {
    const std::size_t size = detail::scalar_size(v.element_type);
    in.check_count(v.count, size, "array element");
    const std::byte* p = in.take(v.count * size, "array");
    if (v.element_type == ValueType::BOOL) {
      for (std::uint64_t i = 0; i < v.count; ++i) {
        if (std::to_integer<unsigned>(p[i]) > 1)
          fail(name_, ": key '", key, "' element ", i, " bool value is ", std::to_integer<unsigned>(p[i]), ", expected 0 or 1");
      }
    }
  }
  v.raw = storage_->bytes().subspan(start, in.pos() - start);
}

inline void File::parse_tensor_info(detail::Cursor& in) {
  using specdec::detail::fail;
  in.set_item("tensor", std::uint64_t(tensors_.size()));
  const std::string_view name = in.str("name");
  in.set_item("tensor", name);
  if (name.size() > 63) fail(name_, ": tensor '", name, "' name has ", name.size(), " bytes, at most 63 allowed");
  TensorInfo t;
  t.name = std::string(name);
  const std::uint32_t n_dims = in.u32("dimension count");
  if (n_dims < 1 || n_dims > 4) fail(name_, ": tensor '", name, "' has ", n_dims, " dimensions, expected 1 to 4");
  std::uint64_t elements = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    const std::uint64_t n = in.u64("dimension");
    if (n == 0) fail(name_, ": tensor '", name, "' dimension ", d, " is 0, expected at least 1");
    auto product = detail::checked_mul(elements, n);
    if (!product || *product > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
      fail(name_, ": tensor '", name, "' element count overflows at dimension ", d, " (", n, ")");
    elements = *product;
    t.dims.push_back(n);
  }
  const std::uint32_t type = in.u32("type");
  const auto known = tensor_type_from_id(type);
  if (!known)
    fail(name_, ": tensor '", name, "' has unknown tensor type ", type, ", expected one of ", detail::known_type_ids());
  t.type = *known;
  if (t.dims[0] % block_size(t.type) != 0) {
    fail(name_, ": tensor '", name, "' row length ", t.dims[0], " is not a multiple of the ", type_name(t.type),
         " block size ", block_size(t.type));
  }
  t.offset = in.u64("offset");
  if (t.offset % alignment_ != 0)
    fail(name_, ": tensor '", name, "' offset ", t.offset, " is not a multiple of the alignment ", alignment_);
  if (!tensor_index_.emplace(name, tensors_.size()).second) fail(name_, ": duplicate tensor '", name, "'");
  tensors_.push_back(std::move(t));
}

inline void File::place_tensors(std::uint64_t info_end) {
  using specdec::detail::fail;
  const std::uint64_t size = storage_->bytes().size();
  data_offset_ = info_end + (alignment_ - info_end % alignment_) % alignment_;
  for (auto& t : tensors_) {
    // row bytes fit: dims[0] / block * type_size <= (2^63 / 1) * 4 might not, so check each step.
    const auto row = detail::checked_mul(t.dims[0] / block_size(t.type), type_size(t.type));
    const auto bytes = row ? detail::checked_mul(*row, t.rows()) : std::nullopt;
    const auto start = detail::checked_add(data_offset_, t.offset);
    const auto end = bytes && start ? detail::checked_add(*start, *bytes) : std::nullopt;
    if (!end) fail(name_, ": tensor '", t.name, "' data (offset ", t.offset, ") ends past byte 2^64, file has ", size, " bytes");
    if (*end > size) fail(name_, ": tensor '", t.name, "' data ends at byte ", *end, ", file has ", size, " bytes");
    t.data = storage_->bytes().subspan(std::size_t(*start), std::size_t(*bytes));
  }
  // No two tensors share bytes (ggml lays them out one after another; overlapping data is a corrupt file).
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    if (b.offset < a.offset + a.data.size())
      fail(name_, ": tensor '", b.name, "' data (offset ", b.offset, ") overlaps tensor '", a.name, "' (offset ",
           a.offset, ", ", a.data.size(), " bytes)");
  }
}

}  // namespace specdec::gguf
