// specdec/llama/quant.hpp — ggml tensor types, f16/bf16 scalars and row dequantisation.
// Entry point: specdec::gguf::dequantize_row. Read next: gguf.hpp (the file reader that uses it).
//
// Block layouts follow ggml (ggml-common.h): every block is packed, little-endian, and every scale
// named d, m or dmin is an IEEE binary16 value unless noted otherwise.
#pragma once

#include <specdec/error.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace specdec::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

/// The ggml tensor types this library understands (ids as stored in GGUF tensor infos).
enum class TensorType : std::uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30
};

namespace detail {

/// The largest id in TensorType; type_traits knows no id above it.
inline constexpr std::uint32_t kLargestTypeId = std::uint32_t(TensorType::BF16);

struct TypeTraits {
  std::string_view name;
  std::size_t block_size;  // elements per block
  std::size_t type_size;   // bytes per block
};

/// Traits by id; a block_size of 0 marks an id this library does not know.
inline constexpr TypeTraits type_traits(std::uint32_t id) {
  switch (id) {
    case 0: return {"f32", 1, 4};
    case 1: return {"f16", 1, 2};
    case 2: return {"q4_0", 32, 18};
    case 3: return {"q4_1", 32, 20};
    case 6: return {"q5_0", 32, 22};
    case 7: return {"q5_1", 32, 24};
    case 8: return {"q8_0", 32, 34};
    case 10: return {"q2_k", 256, 84};
    case 11: return {"q3_k", 256, 110};
    case 12: return {"q4_k", 256, 144};
    case 13: return {"q5_k", 256, 176};
    case 14: return {"q6_k", 256, 210};
    case 30: return {"bf16", 1, 2};
    default: return {"unknown", 0, 0};
  }
}

/// "f32 (0), f16 (1), ..., bf16 (30)": the ids this library knows, for errors about one it does not.
inline std::string known_type_ids() {
  std::string text;
  for (std::uint32_t id = 0; id <= kLargestTypeId; ++id)
    if (const TypeTraits traits = type_traits(id); traits.block_size != 0)
      text.append(text.empty() ? "" : ", ").append(traits.name).append(" (" + std::to_string(id) + ")");
  return text;
}

}  // namespace detail

/// Lowercase ggml name of a type ("q4_1"); "unknown" for an id outside the enum.
inline std::string_view type_name(TensorType type) { return detail::type_traits(std::uint32_t(type)).name; }
/// Elements per block (1 for f32/f16/bf16, 32 for q4_0..q8_0, 256 for the k-quants).
inline std::size_t block_size(TensorType type) { return detail::type_traits(std::uint32_t(type)).block_size; }
/// Bytes per block.
inline std::size_t type_size(TensorType type) { return detail::type_traits(std::uint32_t(type)).type_size; }

/// The TensorType with this id, or nullopt when the id is not one this library knows.
inline std::optional<TensorType> tensor_type_from_id(std::uint32_t id) {
  if (detail::type_traits(id).block_size == 0) return std::nullopt;
  return TensorType(id);
}

// ---------------------------------------------------------------------------------------------
// Scalars
// ---------------------------------------------------------------------------------------------

/// IEEE binary16 -> float, exact (subnormals, inf and NaN included).
inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = float(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// float -> IEEE binary16, rounding to nearest even; overflow gives inf, NaN stays NaN (quiet).
inline std::uint16_t float_to_fp16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = std::uint16_t((bits >> 16) & 0x8000u);
  std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return std::uint16_t(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  if (magnitude >= 0x477FF000u) return std::uint16_t(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (magnitude < 0x38800000u) {
    // Subnormal half (below 2^-14): adding 0.5 makes the float's ulp 2^-24, so the FPU rounds to
    // nearest even and the low mantissa bits are the half's mantissa.
    const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
    return std::uint16_t(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3F000000u));
  }
  const std::uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xC8000FFFu + odd;  // rebias exponent 127 -> 15 and round half to even
  return std::uint16_t(sign | (magnitude >> 13));
}

/// bfloat16 -> float: the float's bit pattern is bits << 16.
inline float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

/// float -> bfloat16, rounding to nearest even; NaN stays NaN (quiet).
inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return std::uint16_t((bits >> 16) | 0x40u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return std::uint16_t(bits >> 16);
}

// ---------------------------------------------------------------------------------------------
// Row dequantisation
// ---------------------------------------------------------------------------------------------

namespace detail {

inline std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline std::int32_t load_i32(const std::byte* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float load_f16(const std::byte* p) { return fp16_to_float(load_u16(p)); }
inline std::uint8_t u8(const std::byte* p, int i) { return std::to_integer<std::uint8_t>(p[i]); }

// Q4_0: f16 d; u8 qs[16]. y[j] = (lo(qs[j]) - 8)·d, y[j+16] = (hi(qs[j]) - 8)·d.
inline void dequantize_block_q4_0(const std::byte* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 16; ++j) {
    const std::uint8_t q = u8(b + 2, j);
    y[j] = float(int(q & 0xF) - 8) * d;
    y[j + 16] = float(int(q >> 4) - 8) * d;
  }
}

// Q4_1: f16 d; f16 m; u8 qs[16]. y = nibble·d + m (low nibbles first, then high nibbles).
inline void dequantize_block_q4_1(const std::byte* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  for (int j = 0; j < 16; ++j) {
    const std::uint8_t q = u8(b + 4, j);
    y[j] = float(q & 0xF) * d + m;
    y[j + 16] = float(q >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the 5th bit of element j is bit j of the LE uint32 qh.
inline void dequantize_block_q5(const std::byte* b, float* y, bool has_min) {
  const float d = load_f16(b);
  const float m = has_min ? load_f16(b + 2) : 0.0f;
  const std::byte* rest = b + (has_min ? 4 : 2);
  std::uint32_t h;
  std::memcpy(&h, rest, 4);
  const int offset = has_min ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    const std::uint8_t q = u8(rest + 4, j);
    const int lo = int((q & 0xF) | (((h >> j) & 1u) << 4)) - offset;
    const int hi = int((q >> 4) | (((h >> (j + 16)) & 1u) << 4)) - offset;
    y[j] = float(lo) * d + m;
    y[j + 16] = float(hi) * d + m;
  }
}

// Q8_0: f16 d; i8 qs[32]. y = qs·d.
inline void dequantize_block_q8_0(const std::byte* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = float(std::int8_t(u8(b + 2, j))) * d;
}

// Q2_K: u8 scales[16]; u8 qs[64]; f16 d; f16 dmin. Group g of 16 has scale (s&0xF), min (s>>4).
inline void dequantize_block_q2_k(const std::byte* b, float* y) {
  const std::byte* scales = b;
  const std::byte* qs = b + 16;
  const float d = load_f16(b + 80), dmin = load_f16(b + 82);
  int group = 0;
  for (int half = 0; half < 2; ++half) {
    const std::byte* q = qs + 32 * half;
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part, ++group) {
        const std::uint8_t s = u8(scales, group);
        const float dl = d * float(s & 0xF), ml = dmin * float(s >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * float((u8(q, 16 * part + l) >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K: u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d. Sixteen 6-bit scales (stored + 32): the low
// 4 bits of scale k are a nibble of scales[k % 8], the high 2 bits sit in scales[8 + k % 4].
inline void dequantize_block_q3_k(const std::byte* b, float* y) {
  const std::byte* hmask = b;
  const std::byte* qs = b + 32;
  const std::byte* packed = b + 96;
  const float d = load_f16(b + 108);
  int scale[16]{};
  for (int k = 0; k < 16; ++k) {
    const int low = k < 8 ? (u8(packed, k) & 0xF) : (u8(packed, k - 8) >> 4);
    const int high = (u8(packed, 8 + k % 4) >> (2 * (k / 4))) & 3;
    scale[k] = (low | (high << 4)) - 32;
  }
  int group = 0;
  unsigned bit = 0;
  for (int half = 0; half < 2; ++half) {
    const std::byte* q = qs + 32 * half;
    for (int shift = 0; shift < 8; shift += 2, ++bit) {
      for (int part = 0; part < 2; ++part, ++group) {
        const float dl = d * float(scale[group]);
        for (int l = 0; l < 16; ++l) {
          const int i = 16 * part + l;
          const int high_set = (u8(hmask, i) >> bit) & 1;
          *y++ = dl * float(int((u8(q, i) >> shift) & 3) - (high_set ? 0 : 4));
        }
      }
    }
  }
}

// 6-bit scale and min of sub-block k (0..7) from the 12 packed bytes of Q4_K / Q5_K.
inline void scale_min_k4(const std::byte* s, int k, float& scale, float& min) {
  if (k < 4) {
    scale = float(u8(s, k) & 63);
    min = float(u8(s, k + 4) & 63);
  } else {
    scale = float((u8(s, k + 4) & 0xF) | ((u8(s, k - 4) >> 6) << 4));
    min = float((u8(s, k + 4) >> 4) | ((u8(s, k) >> 6) << 4));
  }
}

// Q4_K: f16 d; f16 dmin; u8 scales[12]; u8 qs[128]. Chunk c of 64: low nibbles of qs[32c..] use
// sub-block 2c, high nibbles sub-block 2c+1; y = d·sc·q − dmin·mn.
// Q5_K adds u8 qh[32] before qs: bit 2c of qh[l] extends the low nibble, bit 2c+1 the high one.
inline void dequantize_block_q45_k(const std::byte* b, float* y, bool five_bit) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const std::byte* scales = b + 4;
  const std::byte* qh = b + 16;
  const std::byte* qs = b + (five_bit ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    float sc_lo, mn_lo, sc_hi, mn_hi;
    scale_min_k4(scales, 2 * c, sc_lo, mn_lo);
    scale_min_k4(scales, 2 * c + 1, sc_hi, mn_hi);
    const float d_lo = d * sc_lo, m_lo = dmin * mn_lo, d_hi = d * sc_hi, m_hi = dmin * mn_hi;
    for (int l = 0; l < 32; ++l) {
      const std::uint8_t q = u8(qs, 32 * c + l);
      int lo = q & 0xF, hi = q >> 4;
      if (five_bit) {
        const std::uint8_t h = u8(qh, l);
        lo += ((h >> (2 * c)) & 1) << 4;
        hi += ((h >> (2 * c + 1)) & 1) << 4;
      }
      y[64 * c + l] = d_lo * float(lo) - m_lo;
      y[64 * c + 32 + l] = d_hi * float(hi) - m_hi;
    }
  }
}

// Q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d (last). Two halves of 128 elements.
inline void dequantize_block_q6_k(const std::byte* b, float* y) {
  const float d = load_f16(b + 208);
  for (int half = 0; half < 2; ++half) {
    const std::byte* ql = b + 64 * half;
    const std::byte* qh = b + 128 + 32 * half;
    const std::byte* sc = b + 192 + 8 * half;
    float* out = y + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const std::uint8_t h = u8(qh, l), a = u8(ql, l), c = u8(ql, l + 32);
      const int q1 = int((a & 0xF) | (((h >> 0) & 3) << 4)) - 32;
      const int q2 = int((c & 0xF) | (((h >> 2) & 3) << 4)) - 32;
      const int q3 = int((a >> 4) | (((h >> 4) & 3) << 4)) - 32;
      const int q4 = int((c >> 4) | (((h >> 6) & 3) << 4)) - 32;
      out[l] = d * float(std::int8_t(u8(sc, is + 0))) * float(q1);
      out[l + 32] = d * float(std::int8_t(u8(sc, is + 2))) * float(q2);
      out[l + 64] = d * float(std::int8_t(u8(sc, is + 4))) * float(q3);
      out[l + 96] = d * float(std::int8_t(u8(sc, is + 6))) * float(q4);
    }
  }
}

}  // namespace detail

/// Dequantises `n` consecutive elements of `type` from `src` into `dst`.
/// requires: n is a multiple of block_size(type); src holds n / block_size(type) blocks
///           (n / block_size * type_size bytes); dst holds n floats.
/// Example: dequantize_row(info.type, info.data.data(), row.data(), info.row_length());
inline void dequantize_row(TensorType type, const std::byte* src, float* dst, std::size_t n) {
  const std::size_t block = block_size(type), bytes = type_size(type);
  if (block == 0) specdec::detail::fail("dequantize_row: unknown tensor type ", std::uint32_t(type));
  if (n % block != 0) {
    specdec::detail::fail("dequantize_row: ", n, " elements is not a multiple of the ", type_name(type),
                          " block size ", block);
  }
  const std::size_t blocks = n / block;
  switch (type) {
    case TensorType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case TensorType::F16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = detail::load_f16(src + 2 * i);
      return;
    case TensorType::BF16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(detail::load_u16(src + 2 * i));
      return;
    default: break;
  }
  for (std::size_t i = 0; i < blocks; ++i, src += bytes, dst += block) {
    switch (type) {
      case TensorType::Q4_0: detail::dequantize_block_q4_0(src, dst); break;
      case TensorType::Q4_1: detail::dequantize_block_q4_1(src, dst); break;
      case TensorType::Q5_0: detail::dequantize_block_q5(src, dst, false); break;
      case TensorType::Q5_1: detail::dequantize_block_q5(src, dst, true); break;
      case TensorType::Q8_0: detail::dequantize_block_q8_0(src, dst); break;
      case TensorType::Q2_K: detail::dequantize_block_q2_k(src, dst); break;
      case TensorType::Q3_K: detail::dequantize_block_q3_k(src, dst); break;
      case TensorType::Q4_K: detail::dequantize_block_q45_k(src, dst, false); break;
      case TensorType::Q5_K: detail::dequantize_block_q45_k(src, dst, true); break;
      case TensorType::Q6_K: detail::dequantize_block_q6_k(src, dst); break;
      default: SPECDEC_ASSERT(false); return;
    }
  }
}

}  // namespace specdec::gguf
