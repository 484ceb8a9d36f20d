// support/gguf_writer.hpp — builds GGUF files in memory for tests (random-weight models, malformed
// files, fuzz seeds). Entry point: specdec::testing::GgufWriter. Read next: specdec/llama/gguf.hpp.
//
//   GgufWriter w;                                   // version 3, alignment 32
//   w.add_string("general.architecture", "llama");
//   w.add_uint32("llama.block_count", 2);
//   w.add_array_strings("tokenizer.ggml.tokens", {"a", "b"});
//   w.add_tensor_f32("output_norm.weight", {8}, values);
//   w.add_tensor_quantized("blk.0.attn_q.weight", {32, 8}, TensorType::Q4_1, values);
//   std::vector<std::byte> bytes = w.finish();      // or w.write(path)
//
// The writer checks nothing about keys and names (so tests can write duplicates and the like); the
// typed add_tensor_* functions do check that the value count matches the dims.
#pragma once

#include <specdec/llama/gguf.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace specdec::testing {

using gguf::TensorType;
using gguf::ValueType;

// ---------------------------------------------------------------------------------------------
// Simple reference quantisers (round to nearest, one scale per block). n is a multiple of 32;
// dst receives n / 32 blocks.
// ---------------------------------------------------------------------------------------------

namespace detail {
inline void store_u16(std::byte* p, std::uint16_t v) { std::memcpy(p, &v, 2); }
}  // namespace detail

/// Q8_0: d = max|x| / 127, q = round(x / d).
inline void quantize_row_q8_0(const float* src, std::byte* dst, std::size_t n) {
  for (std::size_t b = 0; b < n / 32; ++b, src += 32, dst += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    detail::store_u16(dst, gguf::float_to_fp16(d));
    for (int j = 0; j < 32; ++j) dst[2 + j] = std::byte(std::uint8_t(std::int8_t(std::lround(src[j] * id))));
  }
}

/// Q4_0: the value of largest magnitude maps to -8, d = that value / -8, q = round(x / d) + 8.
inline void quantize_row_q4_0(const float* src, std::byte* dst, std::size_t n) {
  for (std::size_t b = 0; b < n / 32; ++b, src += 32, dst += 18) {
    float max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(src[j]) > std::fabs(max)) max = src[j];
    const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    detail::store_u16(dst, gguf::float_to_fp16(d));
    for (int j = 0; j < 16; ++j) {
      const auto lo = std::clamp<long>(std::lround(src[j] * id) + 8, 0, 15);
      const auto hi = std::clamp<long>(std::lround(src[j + 16] * id) + 8, 0, 15);
      dst[2 + j] = std::byte(std::uint8_t(lo | (hi << 4)));
    }
  }
}

/// Q4_1: m = min, d = (max - min) / 15, q = round((x - m) / d).
inline void quantize_row_q4_1(const float* src, std::byte* dst, std::size_t n) {
  for (std::size_t b = 0; b < n / 32; ++b, src += 32, dst += 20) {
    const auto [lo_it, hi_it] = std::minmax_element(src, src + 32);
    const float min = *lo_it, d = (*hi_it - min) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
    detail::store_u16(dst, gguf::float_to_fp16(d));
    detail::store_u16(dst + 2, gguf::float_to_fp16(min));
    for (int j = 0; j < 16; ++j) {
      const auto lo = std::clamp<long>(std::lround((src[j] - min) * id), 0, 15);
      const auto hi = std::clamp<long>(std::lround((src[j + 16] - min) * id), 0, 15);
      dst[4 + j] = std::byte(std::uint8_t(lo | (hi << 4)));
    }
  }
}

/// Bytes of a tensor of `type` with these dims (dims[0] must be a multiple of the block size).
inline std::size_t tensor_bytes(TensorType type, std::span<const std::uint64_t> dims) {
  std::size_t elements = 1;
  for (auto d : dims) elements *= std::size_t(d);
  return elements / gguf::block_size(type) * gguf::type_size(type);
}

/// Encodes `values` (row-major, n a multiple of the block size for quantised types) as `type`.
/// Supports F32, F16, BF16, Q8_0, Q4_0, Q4_1.
inline std::vector<std::byte> quantize(TensorType type, std::span<const float> values) {
  const std::size_t n = values.size();
  if (n % gguf::block_size(type) != 0) throw std::invalid_argument("quantize: value count not a multiple of the block size");
  std::vector<std::byte> out(n / gguf::block_size(type) * gguf::type_size(type));
  switch (type) {
    case TensorType::F32: if (n) std::memcpy(out.data(), values.data(), n * 4); break;
    case TensorType::F16: for (std::size_t i = 0; i < n; ++i) detail::store_u16(&out[2 * i], gguf::float_to_fp16(values[i])); break;
    case TensorType::BF16: for (std::size_t i = 0; i < n; ++i) detail::store_u16(&out[2 * i], gguf::float_to_bf16(values[i])); break;
    case TensorType::Q8_0: quantize_row_q8_0(values.data(), out.data(), n); break;
    case TensorType::Q4_0: quantize_row_q4_0(values.data(), out.data(), n); break;
    case TensorType::Q4_1: quantize_row_q4_1(values.data(), out.data(), n); break;
    default: throw std::invalid_argument("quantize: unsupported type " + std::string(gguf::type_name(type)));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The writer
// ---------------------------------------------------------------------------------------------

class GgufWriter {
 public:
  /// A tensor exactly as it will be written; `offset` overrides the computed offset, `type_id` may
  /// be any number (for malformed files).
  struct RawTensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::uint32_t type_id = 0;
    std::vector<std::byte> data;
    std::optional<std::uint64_t> offset;
  };

  explicit GgufWriter(std::uint32_t version = 3) : version_(version) {}

  /// Writes `version` into the header (anything, for malformed files).
  void set_version(std::uint32_t version) { version_ = version; }
  /// Uses `alignment` for padding and, when write_key, adds general.alignment as uint32.
  void set_alignment(std::uint32_t alignment, bool write_key = true) {
    alignment_ = alignment;
    if (write_key) add_uint32("general.alignment", alignment);
  }

  // ---- metadata scalars ----
  void add_uint8(std::string_view key, std::uint8_t v) { add_scalar(key, ValueType::UINT8, v); }
  void add_int8(std::string_view key, std::int8_t v) { add_scalar(key, ValueType::INT8, v); }
  void add_uint16(std::string_view key, std::uint16_t v) { add_scalar(key, ValueType::UINT16, v); }
  void add_int16(std::string_view key, std::int16_t v) { add_scalar(key, ValueType::INT16, v); }
  void add_uint32(std::string_view key, std::uint32_t v) { add_scalar(key, ValueType::UINT32, v); }
  void add_int32(std::string_view key, std::int32_t v) { add_scalar(key, ValueType::INT32, v); }
  void add_uint64(std::string_view key, std::uint64_t v) { add_scalar(key, ValueType::UINT64, v); }
  void add_int64(std::string_view key, std::int64_t v) { add_scalar(key, ValueType::INT64, v); }
  void add_float32(std::string_view key, float v) { add_scalar(key, ValueType::FLOAT32, v); }
  void add_float64(std::string_view key, double v) { add_scalar(key, ValueType::FLOAT64, v); }
  void add_bool(std::string_view key, bool v) { add_scalar(key, ValueType::BOOL, std::uint8_t(v)); }
  void add_string(std::string_view key, std::string_view v) {
    begin_kv(key, ValueType::STRING);
    put_string(kv_, v);
  }

  // ---- metadata arrays ----
  void add_array_strings(std::string_view key, const std::vector<std::string>& values) {
    begin_array(key, ValueType::STRING, values.size());
    for (const auto& s : values) put_string(kv_, s);
  }
  void add_array_uint8(std::string_view key, std::span<const std::uint8_t> v) { add_array(key, ValueType::UINT8, v); }
  void add_array_int8(std::string_view key, std::span<const std::int8_t> v) { add_array(key, ValueType::INT8, v); }
  void add_array_uint16(std::string_view key, std::span<const std::uint16_t> v) { add_array(key, ValueType::UINT16, v); }
  void add_array_int16(std::string_view key, std::span<const std::int16_t> v) { add_array(key, ValueType::INT16, v); }
  void add_array_uint32(std::string_view key, std::span<const std::uint32_t> v) { add_array(key, ValueType::UINT32, v); }
  void add_array_int32(std::string_view key, std::span<const std::int32_t> v) { add_array(key, ValueType::INT32, v); }
  void add_array_uint64(std::string_view key, std::span<const std::uint64_t> v) { add_array(key, ValueType::UINT64, v); }
  void add_array_int64(std::string_view key, std::span<const std::int64_t> v) { add_array(key, ValueType::INT64, v); }
  void add_array_float32(std::string_view key, std::span<const float> v) { add_array(key, ValueType::FLOAT32, v); }
  void add_array_float64(std::string_view key, std::span<const double> v) { add_array(key, ValueType::FLOAT64, v); }
  void add_array_bool(std::string_view key, const std::vector<bool>& values) {
    begin_array(key, ValueType::BOOL, values.size());
    for (bool b : values) kv_.push_back(std::byte(b ? 1 : 0));
  }
  /// A key followed by arbitrary value bytes: `type_id` (any number) then `value` verbatim.
  void add_raw(std::string_view key, std::uint32_t type_id, std::span<const std::byte> value) {
    put_string(kv_, key);
    put(kv_, type_id);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++kv_count_;
  }

  // ---- tensors ----
  /// Raw bytes already in `type`'s encoding; their size must match the dims.
  void add_tensor(std::string_view name, std::vector<std::uint64_t> dims, TensorType type, std::span<const std::byte> raw) {
    if (raw.size() != tensor_bytes(type, dims)) throw std::invalid_argument("add_tensor: byte count does not match dims");
    tensors_.push_back({std::string(name), std::move(dims), std::uint32_t(type), {raw.begin(), raw.end()}, std::nullopt});
  }
  /// Float values (row-major, dims[0] contiguous) encoded as `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
  void add_tensor_quantized(std::string_view name, std::vector<std::uint64_t> dims, TensorType type, std::span<const float> values) {
    std::size_t elements = 1;
    for (auto d : dims) elements *= std::size_t(d);
    if (values.size() != elements) throw std::invalid_argument("add_tensor: value count does not match dims");
    if (dims.empty() || dims[0] % gguf::block_size(type) != 0) throw std::invalid_argument("add_tensor: dims[0] not a multiple of the block size");
    const auto bytes = quantize(type, values);
    add_tensor(name, std::move(dims), type, bytes);
  }
  void add_tensor_f32(std::string_view name, std::vector<std::uint64_t> dims, std::span<const float> values) {
    add_tensor_quantized(name, std::move(dims), TensorType::F32, values);
  }
  void add_tensor_f16(std::string_view name, std::vector<std::uint64_t> dims, std::span<const float> values) {
    add_tensor_quantized(name, std::move(dims), TensorType::F16, values);
  }
  void add_tensor_bf16(std::string_view name, std::vector<std::uint64_t> dims, std::span<const float> values) {
    add_tensor_quantized(name, std::move(dims), TensorType::BF16, values);
  }
  /// Anything at all, for malformed files.
  void add_tensor_raw(RawTensor tensor) { tensors_.push_back(std::move(tensor)); }

  /// The complete file: header, metadata, tensor infos, padding, tensor data (each tensor padded to
  /// the alignment).
  std::vector<std::byte> finish() const {
    const std::uint64_t a = alignment_;
    std::vector<std::byte> out;
    out.insert(out.end(), {std::byte('G'), std::byte('G'), std::byte('U'), std::byte('F')});
    put(out, version_);
    put(out, std::uint64_t(tensors_.size()));
    put(out, kv_count_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    std::uint64_t offset = 0;
    for (const auto& t : tensors_) {
      put_string(out, t.name);
      put(out, std::uint32_t(t.dims.size()));
      for (auto d : t.dims) put(out, d);
      put(out, t.type_id);
      put(out, t.offset.value_or(offset));
      offset += (t.data.size() + a - 1) / a * a;
    }
    if (tensors_.empty()) return out;
    out.resize((out.size() + a - 1) / a * a);
    for (const auto& t : tensors_) {
      out.insert(out.end(), t.data.begin(), t.data.end());
      out.resize((out.size() + a - 1) / a * a);
    }
    return out;
  }

  /// finish() written to `path`.
  void write(const std::filesystem::path& path) const {
    const auto bytes = finish();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + path.string());
  }

 private:
  template <class T>
  static void put(std::vector<std::byte>& out, T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  }
  static void put_string(std::vector<std::byte>& out, std::string_view s) {
    put(out, std::uint64_t(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out.insert(out.end(), p, p + s.size());
  }
  void begin_kv(std::string_view key, ValueType type) {
    put_string(kv_, key);
    put(kv_, std::uint32_t(type));
    ++kv_count_;
  }
  void begin_array(std::string_view key, ValueType element, std::size_t n) {
    begin_kv(key, ValueType::ARRAY);
    put(kv_, std::uint32_t(element));
    put(kv_, std::uint64_t(n));
  }
  template <class T>
  void add_scalar(std::string_view key, ValueType type, T v) {
    begin_kv(key, type);
    put(kv_, v);
  }
  template <class T>
  void add_array(std::string_view key, ValueType element, std::span<const T> values) {
    begin_array(key, element, values.size());
    for (const T& v : values) put(kv_, v);
  }

  std::uint32_t version_;
  std::uint32_t alignment_ = 32;
  std::uint64_t kv_count_ = 0;
  std::vector<std::byte> kv_;  // serialized metadata entries
  std::vector<RawTensor> tensors_;
};

}  // namespace specdec::testing
