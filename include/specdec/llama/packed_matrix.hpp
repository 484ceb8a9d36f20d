// specdec/llama/packed_matrix.hpp — weight matrices repacked at load time for the batch-invariant kernel.
// Entry point: PackedMatrix. Read next: matmul.hpp (the kernel and why it is batch-invariant).
//
// Layout: a matrix of `rows` outputs and `cols` inputs is cut into panels of 16 rows (the last one padded with
// zero rows). Inside a panel, for each input index k the 16 rows' weights are contiguous, so one vector load
// gives 16 output rows' weights for one k and y[16 rows] accumulates over k in one register:
//   f32   [cols][16] floats
//   bf16  [cols/2][16][2] bf16 (upper halves of floats): column pairs (2j, 2j+1) of each row side by side, the
//         operand layout of AVX-512 BF16 dot products; an odd last column is paired with a zero. bf16 (not
//         bf16_dot) stores its panels in pairs, interleaved 64 bytes at a time: panel 2i's column pair j, then
//         panel 2i+1's, then panel 2i's pair j+1 (an odd last panel is paired with zeros). So one sequential
//         read feeds two panels' accumulators, two chains of fused multiply-adds where one panel alone is one
//         chain, bound by the FMA's latency (see detail::single_stream_steps)
// The block encodings keep GGUF's quant blocks (the same scales and quants), with the quants as 64-byte vectors
// [16 rows][4 bytes], the operand layout of AVX-512 VNNI dpbusd:
//   q4_0  per 32-column block: d[16] f16, then 4 vectors; vector g, row l = GGUF quant bytes 4g .. 4g+3 of
//         row l                                                       (w = (q − 8)·d)
//   q4_1  per block: d[16] f16, m[16] f16, then the same 4 vectors    (w = q·d + m)
//   q8_0  per block: d[16] f16, then 8 vectors; vector g, row l = quants 4g .. 4g+3 of row l plus 128 (u8)
//                                                                     (w = q·d)
// where a q4 quant byte j holds column j (low nibble) and column j + 16 (high nibble), as in GGUF. The *_dot
// encodings store exactly the same; they differ in how the kernel takes the inputs (see WeightFormat).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/llama/detail/huge_pages.hpp"
#include "specdec/llama/quant.hpp"

namespace specdec::llama {

/// The in-memory weight format chosen at load time.
enum class WeightFormat {
  f32,        ///< the GGUF weights dequantised to float, exactly
  bf16,       ///< the dequantised weights rounded to bfloat16 (half the bytes of f32), float activations
  bf16_dot,   ///< bf16 weights, and activations rounded to bf16 inside each product (AVX-512 BF16 dot products:
              ///< twice the multiply rate of f32; the one format whose arithmetic differs from float math).
              ///< Without AVX-512 BF16, float products of the bf16-rounded activations (the bf16 kernels)
  quantized,  ///< Q4_0 / Q4_1 / Q8_0 blocks kept as they are, multiplied as integers (VNNI dot products) with the
              ///< inputs as 24-bit integers per 32-column block, split into three int8 digits: about as precise as
              ///< float products (every input within 2^-23 of its block's largest); other tensor types as f32.
              ///< Without AVX-512 VNNI: the AVX2 block kernels (AVX2, FMA and F16C), else the scalar twin.
  quantized_dot,  ///< the same blocks, with inputs quantised to 8 bits per 32-column block (one digit, as llama.cpp
                  ///< does): a third of the integer work, 7 bits of input precision; other types as `quantized`
};

inline std::string_view to_string(WeightFormat format) {
  switch (format) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::bf16_dot: return "bf16_dot";
    case WeightFormat::quantized: return "quantized";
    case WeightFormat::quantized_dot: return "quantized_dot";
  }
  return "unknown";
}

/// How one packed matrix stores its weights (see the layout table at the top of this file) and how the kernel
/// takes its inputs: bf16_dot stores weights as bf16 does but multiplies them with bf16-rounded inputs; q8_0,
/// q4_0 and q4_1 take 24-bit integer inputs (three int8 digits), their *_dot twins 8-bit ones.
enum class PanelEncoding { f32, bf16, bf16_dot, q8_0, q4_0, q4_1, q8_0_dot, q4_0_dot, q4_1_dot };

/// Whether an encoding is built from float rows (rather than from GGUF quant blocks).
constexpr bool is_float_encoding(PanelEncoding e) {
  return e == PanelEncoding::f32 || e == PanelEncoding::bf16 || e == PanelEncoding::bf16_dot;
}

/// Whether an encoding multiplies integer quants with 8-bit inputs (see detail/matmul_dot_kernels.hpp).
constexpr bool is_dot_encoding(PanelEncoding e) {
  return e == PanelEncoding::q8_0_dot || e == PanelEncoding::q4_0_dot || e == PanelEncoding::q4_1_dot;
}

/// The encoding with the same GGUF block type: q8_0_dot -> q8_0 and so on; others unchanged.
constexpr PanelEncoding block_type(PanelEncoding e) {
  switch (e) {
    case PanelEncoding::q8_0_dot: return PanelEncoding::q8_0;
    case PanelEncoding::q4_0_dot: return PanelEncoding::q4_0;
    case PanelEncoding::q4_1_dot: return PanelEncoding::q4_1;
    default: return e;
  }
}

inline constexpr std::size_t panel_rows = 16;   // output rows per panel: one AVX-512 register of floats
inline constexpr std::size_t quant_block = 32;  // columns per Q4_0 / Q4_1 / Q8_0 block

namespace detail {

inline std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

/// Bytes of one 32-column block of one panel, for the block encodings.
constexpr std::size_t panel_block_bytes(PanelEncoding e) {
  switch (block_type(e)) {
    case PanelEncoding::q8_0: return 2 * panel_rows + quant_block * panel_rows;
    case PanelEncoding::q4_0: return 2 * panel_rows + quant_block / 2 * panel_rows;
    case PanelEncoding::q4_1: return 4 * panel_rows + quant_block / 2 * panel_rows;
    default: return 0;
  }
}

/// Byte offset of quant byte j of row lane l inside a block's quants: [j / 4][16][4] bytes.
constexpr std::size_t quant_offset(std::size_t j, std::size_t lane) { return (j / 4 * panel_rows + lane) * 4 + j % 4; }

/// Whether an encoding stores its panels in interleaved pairs (bf16; see the layout above). bf16_dot, whose
/// kernel's chains are shorter than bf16's, does not: on the Zen 4 of 2026-12-04 (two models in one process,
/// rounds of 40 one-position forwards alternating, both load orders, 60 rounds each) pairs took bf16 to
/// 0.984x and 0.955x the time at 1 position but bf16_dot to 1.034x and 1.052x, and 1.02x at 5.
constexpr bool interleaves_panel_pairs(PanelEncoding e) { return e == PanelEncoding::bf16; }

/// Bytes from one column pair of a bf16 or bf16_dot panel to its next: its own 64, and where the encoding
/// interleaves its panels in pairs its partner's 64 as well.
constexpr std::size_t bf16_pair_stride(PanelEncoding e) {
  return (interleaves_panel_pairs(e) ? 2 : 1) * panel_rows * 4;
}

/// Byte offset of column k, row lane l from the start of a bf16 or bf16_dot panel (its first column pair);
/// stride: bf16_pair_stride.
constexpr std::size_t bf16_offset(std::size_t k, std::size_t lane, std::size_t stride) {
  return k / 2 * stride + (lane * 2 + k % 2) * 2;
}

/// Calls visit(w, k) with the 16 rows' (dequantised) weights w[16] of column k, for every column of one panel:
/// for the float encodings in the kernel's accumulation order (the portable float kernel uses it), for the block
/// encodings in the order of their quant bytes (PackedMatrix::row uses it; their kernels work on the integers).
template <class Visit>
void visit_panel(const std::byte* panel, PanelEncoding encoding, std::size_t cols, Visit&& visit) {
  float w[panel_rows], hi[panel_rows], d[panel_rows], m[panel_rows];
  const std::size_t blocks = cols / quant_block;
  const std::size_t block_bytes = panel_block_bytes(encoding);
  switch (block_type(encoding)) {
    case PanelEncoding::f32:
      for (std::size_t k = 0; k < cols; ++k) {
        std::memcpy(w, panel + k * panel_rows * 4, sizeof w);
        visit(w, k);
      }
      return;
    case PanelEncoding::bf16:
    case PanelEncoding::bf16_dot:
      for (std::size_t k = 0; k < cols; ++k) {
        for (std::size_t l = 0; l < panel_rows; ++l)
          w[l] = gguf::bf16_to_float(load_u16(panel + bf16_offset(k, l, bf16_pair_stride(encoding))));
        visit(w, k);
      }
      return;
    case PanelEncoding::q8_0:
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* block = panel + b * block_bytes;
        for (std::size_t l = 0; l < panel_rows; ++l) d[l] = gguf::fp16_to_float(load_u16(block + 2 * l));
        for (std::size_t j = 0; j < quant_block; ++j) {
          for (std::size_t l = 0; l < panel_rows; ++l)
            w[l] = static_cast<float>(static_cast<std::int8_t>(
                       static_cast<unsigned>(block[2 * panel_rows + quant_offset(j, l)]) ^ 0x80u)) *
                   d[l];
          visit(w, b * quant_block + j);
        }
      }
      return;
    case PanelEncoding::q4_0:
    case PanelEncoding::q4_1: {
      const bool has_min = block_type(encoding) == PanelEncoding::q4_1;
      const std::size_t q_offset = (has_min ? 4 : 2) * panel_rows;
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* block = panel + b * block_bytes;
        for (std::size_t l = 0; l < panel_rows; ++l) {
          d[l] = gguf::fp16_to_float(load_u16(block + 2 * l));
          m[l] = has_min ? gguf::fp16_to_float(load_u16(block + 2 * panel_rows + 2 * l)) : -8.0f * d[l];
        }
        for (std::size_t j = 0; j < quant_block / 2; ++j) {
          for (std::size_t l = 0; l < panel_rows; ++l) {
            const auto q = static_cast<unsigned>(block[q_offset + quant_offset(j, l)]);
            w[l] = static_cast<float>(q & 15u) * d[l] + m[l];
            hi[l] = static_cast<float>(q >> 4) * d[l] + m[l];
          }
          visit(w, b * quant_block + j);
          visit(hi, b * quant_block + quant_block / 2 + j);
        }
      }
      return;
    }
    default: return;  // block_type never returns a dot encoding
  }
}

/// 64-byte aligned storage unit, so that panels start on cache lines.
struct alignas(64) CacheLine {
  std::byte bytes[64];
};

/// The bytes of a run of cache lines from `line` on, as one array: an entry may span lines, so writers take
/// this pointer rather than the first line's `bytes` (GCC 12 bounds writes through that member by its 64 bytes
/// and warned of an overflow for -march=sapphirerapids).
inline std::byte* line_bytes(CacheLine* line) { return reinterpret_cast<std::byte*>(line); }
inline const std::byte* line_bytes(const CacheLine* line) { return reinterpret_cast<const std::byte*>(line); }

}  // namespace detail

/// A weight matrix [rows, cols] (y = W·x maps cols inputs to rows outputs) repacked into 16-row panels.
/// Immutable after construction; shared freely between models.
class PackedMatrix {
 public:
  PackedMatrix() = default;

  /// Packs float rows: row_fn(r, out) writes the cols values of row r to out. requires: is_float_encoding.
  template <class RowFn>
  static PackedMatrix from_rows(std::size_t rows, std::size_t cols, PanelEncoding encoding, RowFn&& row_fn) {
    if (!is_float_encoding(encoding)) specdec::detail::fail("packed matrix from float rows needs a float encoding");
    PackedMatrix m(rows, cols, encoding);
    std::vector<float> row(cols);
    for (std::size_t r = 0; r < rows; ++r) {
      row_fn(r, row.data());
      std::byte* panel = m.panel_data(r / panel_rows);
      const std::size_t lane = r % panel_rows;
      for (std::size_t k = 0; k < cols; ++k) {
        if (encoding == PanelEncoding::f32) {
          std::memcpy(panel + (k * panel_rows + lane) * 4, &row[k], 4);
        } else {
          const std::uint16_t h = gguf::float_to_bf16(row[k]);
          std::memcpy(panel + detail::bf16_offset(k, lane, detail::bf16_pair_stride(encoding)), &h, 2);
        }
      }
    }
    return m;
  }

  /// Packs GGUF quant blocks: `data` holds `rows` rows of cols / 32 consecutive Q8_0, Q4_0 or Q4_1 blocks.
  static PackedMatrix from_blocks(std::size_t rows, std::size_t cols, PanelEncoding encoding, const std::byte* data) {
    if (is_float_encoding(encoding))
      specdec::detail::fail("packed matrix from quant blocks needs a block encoding");
    if (cols % quant_block != 0) specdec::detail::fail("quantized matrix needs cols divisible by 32, got ", cols);
    PackedMatrix m(rows, cols, encoding);
    const bool has_min = block_type(encoding) == PanelEncoding::q4_1;
    const auto flip = std::byte(block_type(encoding) == PanelEncoding::q8_0 ? 0x80 : 0);  // int8 -> uint8 + 128
    const std::size_t scales = has_min ? 2 : 1;  // f16 values before the quants in a GGUF block
    const std::size_t quant_bytes = block_type(encoding) == PanelEncoding::q8_0 ? quant_block : quant_block / 2;
    const std::size_t gguf_block = 2 * scales + quant_bytes;
    const std::size_t block_bytes = detail::panel_block_bytes(encoding);
    const std::size_t blocks = cols / quant_block;
    for (std::size_t r = 0; r < rows; ++r) {
      std::byte* panel = m.panel_data(r / panel_rows);
      const std::size_t lane = r % panel_rows;
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* src = data + (r * blocks + b) * gguf_block;
        std::byte* dst = panel + b * block_bytes;
        for (std::size_t s = 0; s < scales; ++s) std::memcpy(dst + (s * panel_rows + lane) * 2, src + 2 * s, 2);
        for (std::size_t j = 0; j < quant_bytes; ++j)
          dst[2 * scales * panel_rows + detail::quant_offset(j, lane)] = src[2 * scales + j] ^ flip;
      }
    }
    return m;
  }

  std::size_t rows() const { return rows_; }
  std::size_t cols() const { return cols_; }
  PanelEncoding encoding() const { return encoding_; }
  std::size_t panels() const { return (rows_ + panel_rows - 1) / panel_rows; }
  std::size_t panel_bytes() const { return panel_bytes_; }
  /// Weight bytes a product streams: all panels once.
  std::size_t bytes() const { return panels() * panel_bytes_; }
  /// Bytes the panels occupy from panel(0) on: bytes(), and where the encoding stores panels in interleaved pairs
  /// (bf16) with an odd number of panels, the last pair's unused half.
  std::size_t stored_bytes() const { return panel_range(0, panels()).bytes; }
  /// The bytes panels [first, last) occupy, in one span; where the encoding stores panels in interleaved pairs
  /// (bf16), the whole pairs they touch. requires: first <= last <= panels().
  std::span<const std::byte> panel_span(std::size_t first, std::size_t last) const {
    const Range range = panel_range(first, last);
    return {storage_.get() + range.offset, range.bytes};
  }
  /// Panel p's first byte (for bf16 and bf16_dot its first column pair; the next one detail::bf16_pair_stride on).
  const std::byte* panel(std::size_t p) const { return storage_.get() + panel_offset(p); }

  /// Writes the (dequantised) weights of row r to out[0 .. cols). requires: r < rows().
  void row(std::size_t r, float* out) const {
    const std::size_t lane = r % panel_rows;
    detail::visit_panel(panel(r / panel_rows), encoding_, cols_,
                        [&](const float* w, std::size_t k) { out[k] = w[lane]; });
  }

 private:
  PackedMatrix(std::size_t rows, std::size_t cols, PanelEncoding encoding)
      : rows_(rows), cols_(cols), encoding_(encoding) {
    switch (encoding) {
      case PanelEncoding::f32: panel_bytes_ = cols * panel_rows * 4; break;
      case PanelEncoding::bf16:
      case PanelEncoding::bf16_dot: panel_bytes_ = (cols + 1) / 2 * panel_rows * 4; break;
      default: panel_bytes_ = cols / quant_block * detail::panel_block_bytes(encoding);
    }
    storage_ = detail::arena_bytes(stored_bytes() + 64);  // zeroed; a spare line for vector over-reads
  }
  struct Range {
    std::size_t offset = 0, bytes = 0;
  };
  /// Where panel_span's bytes lie in storage_ (computed before the storage exists, for its size).
  Range panel_range(std::size_t first, std::size_t last) const {
    SPECDEC_ASSERT(first <= last && last <= panels());
    if (detail::interleaves_panel_pairs(encoding_) && first < last) first = first / 2 * 2, last = (last + 1) / 2 * 2;
    return {first * panel_bytes_, (last - first) * panel_bytes_};
  }
  std::byte* panel_data(std::size_t p) { return storage_.get() + panel_offset(p); }
  std::size_t panel_offset(std::size_t p) const {
    if (!detail::interleaves_panel_pairs(encoding_)) return p * panel_bytes_;
    return p / 2 * 2 * panel_bytes_ + p % 2 * panel_rows * 4;
  }

  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  PanelEncoding encoding_ = PanelEncoding::f32;
  std::size_t panel_bytes_ = 0;
  std::shared_ptr<std::byte> storage_;  // [panels][panel_bytes] (bf16: in pairs), zero-padded, in huge pages; shared
};

/// One output of a matmul call: y[p, r] (+)= Σ_k W[r, k]·x[p, k] for r < w->rows(), p < positions.
struct MatmulOutput {
  const PackedMatrix* weights = nullptr;
  float* y = nullptr;            // [positions, y_stride], row-major
  std::size_t y_stride = 0;      // floats between consecutive positions' rows
  bool accumulate = false;       // add to y (a residual connection) instead of overwriting it
};

/// A matmul call's inputs already quantised by the caller for the block encodings, in the layout of
/// detail::quantize_inputs with `digits` digits (1 for the *_dot encodings, 3 for the others): the kernels
/// use them instead of quantising the inputs on every thread. Outputs whose encoding takes another digit
/// count, and the float encodings, ignore them. Empty (bytes == nullptr): the kernels quantise.
struct QuantizedInputs {
  const std::byte* bytes = nullptr;
  int digits = 0;
};

/// Digits of the inputs that a format's block kernels take: 1 for quantized_dot, 3 for quantized, 0 (no
/// quantised inputs) for the float formats.
constexpr int quantized_input_digits(WeightFormat format) {
  return format == WeightFormat::quantized_dot ? 1 : format == WeightFormat::quantized ? 3 : 0;
}

}  // namespace specdec::llama
