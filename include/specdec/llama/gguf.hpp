// specdec/llama/gguf.hpp — a read-only, memory-mapped GGUF (v2, v3) reader.
// Entry point: specdec::gguf::File::open. Read next: detail/gguf_parse.hpp (the header's checks), quant.hpp (tensor
// types and dequantisation).
//
// File::open validates the whole header at once: every count, length, offset and size is checked
// against the bytes that remain before it is used, so a malformed file gives a specdec::Error that
// names the file, the key or tensor and expected vs found, never a crash. Metadata values are indexed
// at open (type and location inside the mapping) and decoded on access; tensors are spans into the
// mapping.
#pragma once

#include <specdec/error.hpp>
#include <specdec/llama/quant.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specdec::gguf {

/// Metadata value types (ids as stored in the file).
enum class ValueType : std::uint32_t {
  UINT8 = 0, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64
};

/// Lowercase name of a value type ("uint32", "string", ...); "unknown" outside the enum.
inline std::string_view value_type_name(ValueType type) {
  constexpr std::string_view names[] = {"uint8",  "int8",  "uint16", "int16",  "uint32", "int32",  "float32",
                                        "bool",   "string", "array", "uint64", "int64",  "float64"};
  const auto id = std::uint32_t(type);
  return id < std::size(names) ? names[id] : std::string_view("unknown");
}

/// One tensor of the file. dims are in GGUF order: dims[0] (ne[0]) is contiguous, so a 2-D weight
/// with dims [K, M] is M rows of K values.
struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> dims;   // [ne0, ne1, ...], 1 to 4 entries, each >= 1
  TensorType type;
  std::uint64_t offset;              // relative to the data section
  std::span<const std::byte> data;   // [rows() * row_bytes()] bytes inside the file mapping

  /// Product of dims.
  std::uint64_t elements() const {
    std::uint64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
  /// Elements per row: dims[0].
  std::uint64_t row_length() const { return dims[0]; }
  /// Number of rows: elements() / row_length().
  std::uint64_t rows() const { return elements() / row_length(); }
  /// Bytes of one row: dims[0] / block_size * type_size.
  std::size_t row_bytes() const { return std::size_t(dims[0] / block_size(type) * type_size(type)); }
  /// rows(), once the shape is checked as a tensor built by hand may get it wrong: 1 to 4 dimensions, none 0,
  /// whole blocks in a row, every row inside `data` (a File's tensors always pass). Throws specdec::Error naming
  /// the tensor otherwise.
  std::uint64_t checked_rows() const {
    using specdec::detail::fail;
    if (dims.empty() || dims.size() > 4) fail("tensor '", name, "' has ", dims.size(), " dimensions, expected 1 to 4");
    for (std::size_t d = 0; d < dims.size(); ++d)
      if (dims[d] == 0) fail("tensor '", name, "' dimension ", d, " is 0, expected at least 1");
    const std::size_t block = block_size(type);
    if (block == 0 || dims[0] % block != 0)
      fail("tensor '", name, "' of type ", std::uint32_t(type), " has no whole blocks in a row of ", dims[0], " elements");
    if (dims[0] / block > data.size() / type_size(type))
      fail("tensor '", name, "' has rows of ", dims[0], " elements, longer than its ", data.size(), " bytes of data");
    const std::uint64_t fit = data.size() / row_bytes();
    std::uint64_t rows = 1;
    for (std::size_t d = 1; d < dims.size(); ++d) {
      if (dims[d] > fit / rows)
        fail("tensor '", name, "' has more rows than its ", data.size(), " bytes of data hold (rows of ", row_bytes(),
             " bytes)");
      rows *= dims[d];
    }
    return rows;
  }
  /// The bytes of row r. Throws specdec::Error unless the shape passes checked_rows() and r < rows().
  std::span<const std::byte> row_data(std::uint64_t r) const {
    if (const std::uint64_t rows = checked_rows(); r >= rows)
      specdec::detail::fail("tensor '", name, "' has ", rows, " rows, asked for row ", r);
    return data.subspan(std::size_t(r) * row_bytes(), row_bytes());
  }
  /// Dequantises row r into dst[0 .. row_length()). Throws as row_data(r) does.
  void dequantize_row(std::uint64_t r, float* dst) const {
    const std::span<const std::byte> bytes = row_data(r);
    gguf::dequantize_row(type, bytes.data(), dst, std::size_t(row_length()));
  }
};

/// The whole tensor as floats, row after row.  // [rows, row_length]
/// Throws specdec::Error as TensorInfo::checked_rows() does.
inline std::vector<float> dequantize(const TensorInfo& tensor) {
  const std::uint64_t rows = tensor.checked_rows();
  std::vector<float> out(std::size_t(rows * tensor.row_length()));
  for (std::uint64_t r = 0; r < rows; ++r)
    tensor.dequantize_row(r, out.data() + std::size_t(r * tensor.row_length()));
  return out;
}

namespace detail {

/// The file's bytes: a read-only private mapping, or an owned buffer (from_bytes).
class Storage {
 public:
  explicit Storage(std::vector<std::byte> bytes) : buffer_(std::move(bytes)), bytes_(buffer_) {}
  Storage(const std::filesystem::path& path) {
    // O_NONBLOCK: opening a FIFO without a writer would otherwise wait for one; fstat below rejects it.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) specdec::detail::fail("cannot open gguf file '", path.string(), "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      specdec::detail::fail("cannot open gguf file '", path.string(), "': not a regular file");
    }
    const auto size = std::size_t(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        specdec::detail::fail("cannot map gguf file '", path.string(), "': ", std::strerror(err));
      }
      mapped_ = p;
      bytes_ = {static_cast<const std::byte*>(p), size};
    }
    ::close(fd);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (mapped_) ::munmap(mapped_, bytes_.size());
  }
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  std::vector<std::byte> buffer_;
  void* mapped_ = nullptr;
  std::span<const std::byte> bytes_;
};

/// Where a metadata value lives in the mapping. Scalars: raw holds the value; strings: the text;
/// arrays: the packed elements (strings keep their uint64 length prefixes).
struct Value {
  ValueType type;
  ValueType element_type;   // arrays only
  std::uint64_t count = 1;  // array element count
  std::span<const std::byte> raw;
};

inline bool is_integer(ValueType t) {
  return t <= ValueType::INT32 || t == ValueType::UINT64 || t == ValueType::INT64;
}
inline bool is_signed(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}
/// Bytes of a fixed-size value; 0 for string and array.
inline std::size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}
template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
/// An integer value as (negative?, two's complement bits); requires is_integer(t).
inline std::pair<bool, std::uint64_t> load_integer(ValueType t, const std::byte* p) {
  switch (t) {
    case ValueType::UINT8: return {false, load<std::uint8_t>(p)};
    case ValueType::INT8: { auto v = load<std::int8_t>(p); return {v < 0, std::uint64_t(std::int64_t(v))}; }
    case ValueType::UINT16: return {false, load<std::uint16_t>(p)};
    case ValueType::INT16: { auto v = load<std::int16_t>(p); return {v < 0, std::uint64_t(std::int64_t(v))}; }
    case ValueType::UINT32: return {false, load<std::uint32_t>(p)};
    case ValueType::INT32: { auto v = load<std::int32_t>(p); return {v < 0, std::uint64_t(std::int64_t(v))}; }
    case ValueType::UINT64: return {false, load<std::uint64_t>(p)};
    default: { auto v = load<std::int64_t>(p); return {v < 0, std::uint64_t(v)}; }
  }
}
inline double load_number(ValueType t, const std::byte* p) {
  if (t == ValueType::FLOAT32) return static_cast<double>(load<float>(p));
  if (t == ValueType::FLOAT64) return load<double>(p);
  const auto [negative, bits] = load_integer(t, p);
  return negative ? double(std::int64_t(bits)) : double(bits);
}

/// Bounds-checked reads over the file bytes (detail/gguf_parse.hpp).
class Cursor;

}  // namespace detail

/// A parsed GGUF file. Move-only: it owns the mapping, and every TensorInfo::data span and every
/// string_view it hands out stay valid while the File (or the File it was moved into) lives.
/// Example:
///   auto file = specdec::gguf::File::open("model.gguf");
///   auto layers = file.get_uint("llama.block_count");
///   const auto& embd = file.tensor("token_embd.weight");
class File {
 public:
  /// Memory-maps `path` read-only and parses it. Throws specdec::Error on any malformation.
  static File open(const std::filesystem::path& path) {
    return File(path.string(), std::make_unique<detail::Storage>(path));
  }
  /// Parses an in-memory file, taking ownership of the bytes (tests, fuzzing).
  static File from_bytes(std::vector<std::byte> bytes, std::string name = "<memory>") {
    return File(std::move(name), std::make_unique<detail::Storage>(std::move(bytes)));
  }

  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;

  const std::string& name() const { return name_; }
  std::uint32_t version() const { return version_; }
  /// general.alignment, or 32 when absent.
  std::uint32_t alignment() const { return alignment_; }
  /// Byte offset of the data section (tensor offsets are relative to it).
  std::uint64_t data_offset() const { return data_offset_; }
  /// The whole file.
  std::span<const std::byte> bytes() const { return storage_->bytes(); }

  // ---- metadata ----
  /// Keys in file order (views into the mapping).
  const std::vector<std::string_view>& keys() const { return keys_; }
  bool has(std::string_view key) const { return values_.contains(key); }
  std::optional<ValueType> type_of(std::string_view key) const {
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second.type;
  }
  /// Element type of an array key. Missing key or not an array -> error.
  ValueType array_type(std::string_view key) const { return array(key).element_type; }
  /// Element count of an array key. Missing key or not an array -> error.
  std::uint64_t array_size(std::string_view key) const { return array(key).count; }

  /// Any integer type; negative, missing or non-integer -> error.
  std::uint64_t get_uint(std::string_view key) const {
    const auto& v = value(key);
    if (!detail::is_integer(v.type)) wrong_type(key, v, "an integer");
    const auto [negative, bits] = detail::load_integer(v.type, v.raw.data());
    if (negative) specdec::detail::fail(name_, ": key '", key, "' is ", std::int64_t(bits), ", expected a non-negative integer");
    return bits;
  }
  /// Like get_uint, but nullopt when the key is absent (a present key of another type is an error).
  std::optional<std::uint64_t> find_uint(std::string_view key) const {
    if (!has(key)) return std::nullopt;
    return get_uint(key);
  }
  /// Any integer type as int64; a uint64 above INT64_MAX, missing or non-integer -> error.
  std::int64_t get_int(std::string_view key) const {
    const auto& v = value(key);
    if (!detail::is_integer(v.type)) wrong_type(key, v, "an integer");
    const auto [negative, bits] = detail::load_integer(v.type, v.raw.data());
    if (!negative && bits > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
      specdec::detail::fail(name_, ": key '", key, "' is ", bits, ", expected at most 2^63-1");
    return std::int64_t(bits);
  }
  /// FLOAT32 or FLOAT64 (integers accepted too).
  double get_float(std::string_view key) const {
    const auto& v = value(key);
    if (!detail::is_integer(v.type) && v.type != ValueType::FLOAT32 && v.type != ValueType::FLOAT64)
      wrong_type(key, v, "a number");
    return detail::load_number(v.type, v.raw.data());
  }
  std::optional<double> find_float(std::string_view key) const {
    if (!has(key)) return std::nullopt;
    return get_float(key);
  }
  bool get_bool(std::string_view key) const {
    const auto& v = value(key);
    if (v.type != ValueType::BOOL) wrong_type(key, v, "bool");
    return v.raw[0] != std::byte{0};
  }
  std::optional<bool> find_bool(std::string_view key) const {
    if (!has(key)) return std::nullopt;
    return get_bool(key);
  }
  std::string get_string(std::string_view key) const { return std::string(get_string_view(key)); }
  /// The string without copying (a view into the mapping).
  std::string_view get_string_view(std::string_view key) const {
    const auto& v = value(key);
    if (v.type != ValueType::STRING) wrong_type(key, v, "string");
    return {reinterpret_cast<const char*>(v.raw.data()), v.raw.size()};
  }
  std::optional<std::string> find_string(std::string_view key) const {
    if (!has(key)) return std::nullopt;
    return get_string(key);
  }
  std::vector<std::string> get_string_array(std::string_view key) const {
    auto views = get_string_views(key);
    return {views.begin(), views.end()};
  }
  /// An array of strings without copying the text (views into the mapping).
  std::vector<std::string_view> get_string_views(std::string_view key) const {
    const auto& v = array(key);
    if (v.element_type != ValueType::STRING) wrong_array_type(key, v, "string");
    std::vector<std::string_view> out;
    out.reserve(std::size_t(v.count));
    // The lengths were checked at open, but a mapped file changed on disk since shows its new bytes here.
    const std::byte* p = v.raw.data();
    const std::byte* const end = p + v.raw.size();
    for (std::uint64_t i = 0; i < v.count; ++i) {
      const std::uint64_t n = end - p < 8 ? 0 : detail::load<std::uint64_t>(p);  // read once: it may change
      if (end - p < 8 || n > std::uint64_t(end - p - 8))
        specdec::detail::fail(name_, ": key '", key, "' string ", i, " no longer fits its array: the file changed "
                              "on disk after it was opened");
      out.emplace_back(reinterpret_cast<const char*>(p + 8), n);
      p += 8 + n;
    }
    return out;
  }
  /// An array of any integer element type; uint64 elements above INT64_MAX -> error.
  std::vector<std::int64_t> get_int_array(std::string_view key) const {
    const auto& v = array(key);
    if (!detail::is_integer(v.element_type)) wrong_array_type(key, v, "an integer type");
    const std::size_t size = detail::scalar_size(v.element_type);
    std::vector<std::int64_t> out(std::size_t(v.count));
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto [negative, bits] = detail::load_integer(v.element_type, v.raw.data() + i * size);
      if (!negative && bits > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
        specdec::detail::fail(name_, ": key '", key, "' element ", i, " is ", bits, ", expected at most 2^63-1");
      out[i] = std::int64_t(bits);
    }
    return out;
  }
  /// An array of FLOAT32/FLOAT64 (or integer) elements.
  std::vector<double> get_float_array(std::string_view key) const {
    const auto& v = array(key);
    const ValueType t = v.element_type;
    if (!detail::is_integer(t) && t != ValueType::FLOAT32 && t != ValueType::FLOAT64)
      wrong_array_type(key, v, "a number type");
    const std::size_t size = detail::scalar_size(t);
    std::vector<double> out(std::size_t(v.count));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = detail::load_number(t, v.raw.data() + i * size);
    return out;
  }
  /// An array of BOOL elements.
  std::vector<bool> get_bool_array(std::string_view key) const {
    const auto& v = array(key);
    if (v.element_type != ValueType::BOOL) wrong_array_type(key, v, "bool");
    std::vector<bool> out(std::size_t(v.count));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = v.raw[i] != std::byte{0};
    return out;
  }

  // ---- tensors ----
  /// Tensors in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  /// Missing -> error naming the file and the tensor.
  const TensorInfo& tensor(std::string_view name) const {
    if (const auto* t = find_tensor(name)) return *t;
    specdec::detail::fail(name_, ": missing tensor '", name, "'");
  }

 private:
  File(std::string name, std::unique_ptr<detail::Storage> storage) : name_(std::move(name)), storage_(std::move(storage)) {
    parse();
  }

  const detail::Value& value(std::string_view key) const {
    auto it = values_.find(key);
    if (it == values_.end()) specdec::detail::fail(name_, ": missing key '", key, "'");
    return it->second;
  }
  const detail::Value& array(std::string_view key) const {
    const auto& v = value(key);
    if (v.type != ValueType::ARRAY) wrong_type(key, v, "array");
    return v;
  }
  [[noreturn]] void wrong_type(std::string_view key, const detail::Value& v, std::string_view expected) const {
    specdec::detail::fail(name_, ": key '", key, "' has type ", value_type_name(v.type), ", expected ", expected);
  }
  [[noreturn]] void wrong_array_type(std::string_view key, const detail::Value& v, std::string_view expected) const {
    specdec::detail::fail(name_, ": key '", key, "' is an array of ", value_type_name(v.element_type),
                          ", expected an array of ", expected);
  }

  void parse();
  void parse_value(detail::Cursor& in, detail::Value& v, std::string_view key);
  void parse_tensor_info(detail::Cursor& in);
  void place_tensors(std::uint64_t info_end);

  std::string name_;
  std::unique_ptr<detail::Storage> storage_;
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::string_view> keys_;                         // views into the mapping
  std::unordered_map<std::string_view, detail::Value> values_;  // key -> value location
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;  // name (in the mapping) -> index
};

/// Returns f(); a specdec::Error it throws is thrown again with "<file name>: " in front. For checks of what was
/// read from `file` made by code that does not know the file (a config's validation, a tokenizer's tables).
template <class F>
decltype(auto) naming_file(const File& file, F&& f) {
  try {
    return f();
  } catch (const specdec::Error& e) {
    specdec::detail::fail(file.name(), ": ", e.what());
  }
}

}  // namespace specdec::gguf

// File::parse and its helpers, out of line.
#include "specdec/llama/detail/gguf_parse.hpp"
