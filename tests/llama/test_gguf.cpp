// Tests of the GGUF reader (specdec/llama/gguf.hpp) and the dequantisers (specdec/llama/quant.hpp).
#include <specdec/llama/gguf.hpp>
#include <specdec/llama/llama_model.hpp>
#include <specdec/llama/tokenizer.hpp>

#include "support/gguf_writer.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>

using namespace specdec::gguf;
using specdec::Error;
using specdec::testing::GgufWriter;
using Catch::Contains;

namespace {

std::vector<std::byte> bytes_of(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(std::byte(std::uint8_t(v)));
  return out;
}
template <class T>
void append(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}
template <class T>
void patch(std::vector<std::byte>& bytes, std::size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}
File parse(std::vector<std::byte> bytes) { return File::from_bytes(std::move(bytes), "test.gguf"); }

std::vector<float> ramp(std::size_t n, float scale = 0.1f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * (float(i % 37) - 18.0f);
  return v;
}

// A small valid file: a few metadata values and one tensor per writable type. Every tensor's size
// is a multiple of 32, so the file ends exactly where the last tensor's data ends.
GgufWriter small_model(std::uint32_t version = 3) {
  GgufWriter w(version);
  w.add_string("general.architecture", "llama");
  w.add_uint32("llama.block_count", 2);
  w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_array_strings("tokenizer.ggml.tokens", {"a", "b", "ab"});
  w.add_array_int32("tokenizer.ggml.token_type", std::vector<std::int32_t>{1, 1, 3});
  w.add_tensor_quantized("q8", {32, 2}, TensorType::Q8_0, ramp(64));  // 68 bytes, padded to 96
  w.add_tensor_quantized("q4", {64}, TensorType::Q4_1, ramp(64));     // 40 bytes, padded to 64
  w.add_tensor_f32("norm", {8}, ramp(8));                             // 32 bytes
  return w;
}

std::vector<float> dequantize_block(TensorType type, const std::vector<std::byte>& block) {
  REQUIRE(block.size() == type_size(type));
  std::vector<float> out(block_size(type));
  dequantize_row(type, block.data(), out.data(), out.size());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Scalars
// ---------------------------------------------------------------------------------------------

TEST_CASE("fp16 bit patterns decode to their IEEE binary16 values", "[gguf]") {
  CHECK(fp16_to_float(0x3C00) == 1.0f);
  CHECK(fp16_to_float(0xC000) == -2.0f);
  CHECK(fp16_to_float(0x7BFF) == 65504.0f);
  CHECK(fp16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(fp16_to_float(0x03FF) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(fp16_to_float(0x0400) == std::ldexp(1.0f, -14));     // smallest normal
  CHECK(fp16_to_float(0x3555) == 0x555p-12f);                // 0.333252
  CHECK(fp16_to_float(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(fp16_to_float(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(fp16_to_float(0x7E00)));
  CHECK(std::isnan(fp16_to_float(0x7C01)));
  CHECK(std::signbit(fp16_to_float(0x8000)));
}

TEST_CASE("float to fp16 rounds to nearest even and saturates to infinity", "[gguf]") {
  CHECK(float_to_fp16(1.0f) == 0x3C00);
  CHECK(float_to_fp16(-2.0f) == 0xC000);
  CHECK(float_to_fp16(65504.0f) == 0x7BFF);
  CHECK(float_to_fp16(65519.0f) == 0x7BFF);
  CHECK(float_to_fp16(65520.0f) == 0x7C00);  // halfway to 65536, odd mantissa: rounds up to inf
  CHECK(float_to_fp16(1e9f) == 0x7C00);
  CHECK(float_to_fp16(-std::numeric_limits<float>::infinity()) == 0xFC00);
  CHECK(float_to_fp16(1.0f + 0x1p-11f) == 0x3C00);      // tie, even stays
  CHECK(float_to_fp16(1.0f + 0x3p-11f) == 0x3C02);      // tie, odd rounds up
  CHECK(float_to_fp16(1.0f + 0x1.1p-11f) == 0x3C01);    // above the tie
  CHECK(float_to_fp16(0x1p-24f) == 0x0001);
  CHECK(float_to_fp16(0x1p-25f) == 0x0000);             // tie to even zero
  CHECK(float_to_fp16(0x3p-25f) == 0x0002);             // tie to even 2
  CHECK(float_to_fp16(0x1.ffcp-15f) == 0x0400);         // rounds up into the smallest normal
  CHECK(float_to_fp16(-0.0f) == 0x8000);
  const std::uint16_t nan = float_to_fp16(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7C00) == 0x7C00);
  CHECK((nan & 0x03FF) != 0);
}

TEST_CASE("every fp16 and bf16 value survives a round trip through float", "[gguf]") {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = std::uint16_t(h);
    const bool fp16_nan = (bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0;
    if (fp16_nan) {
      REQUIRE(std::isnan(fp16_to_float(float_to_fp16(fp16_to_float(bits)))));
    } else {
      REQUIRE(float_to_fp16(fp16_to_float(bits)) == bits);
    }
    const bool bf16_nan = (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0;
    if (bf16_nan) {
      REQUIRE(std::isnan(bf16_to_float(float_to_bf16(bf16_to_float(bits)))));
    } else {
      REQUIRE(float_to_bf16(bf16_to_float(bits)) == bits);
    }
  }
}

TEST_CASE("bf16 is the top half of a float, rounded to nearest even", "[gguf]") {
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  CHECK(bf16_to_float(0xC000) == -2.0f);
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3F80);  // tie, even stays
  CHECK(float_to_bf16(1.0f + 0x3p-8f) == 0x3F82);  // tie, odd rounds up
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // overflows to inf
  // A NaN whose payload sits only in the low 16 bits must stay NaN.
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7F800001u)))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("type traits match the ggml block table", "[gguf]") {
  CHECK(type_name(TensorType::Q4_1) == "q4_1");
  CHECK(block_size(TensorType::F32) == 1);
  CHECK(type_size(TensorType::BF16) == 2);
  CHECK(block_size(TensorType::Q8_0) == 32);
  CHECK(type_size(TensorType::Q8_0) == 34);
  CHECK(type_size(TensorType::Q4_0) == 18);
  CHECK(type_size(TensorType::Q5_1) == 24);
  CHECK(block_size(TensorType::Q6_K) == 256);
  CHECK(type_size(TensorType::Q6_K) == 210);
  CHECK(type_size(TensorType::Q2_K) == 84);
  CHECK(type_size(TensorType::Q3_K) == 110);
  CHECK(type_size(TensorType::Q5_K) == 176);
  CHECK_FALSE(tensor_type_from_id(9).has_value());
  CHECK(tensor_type_from_id(30) == TensorType::BF16);
}

// ---------------------------------------------------------------------------------------------
// Dequantisers against hand-built blocks (expected values from the block formulas)
// ---------------------------------------------------------------------------------------------

TEST_CASE("f32, f16 and bf16 rows dequantise element by element", "[gguf]") {
  std::vector<std::byte> f32;
  for (float v : {1.5f, -2.25f}) append(f32, v);
  CHECK(dequantize_block(TensorType::F32, {f32.begin(), f32.begin() + 4}) == std::vector<float>{1.5f});
  const auto f16 = bytes_of({0x00, 0x3C, 0x00, 0xC0});
  std::vector<float> out(2);
  dequantize_row(TensorType::F16, f16.data(), out.data(), 2);
  CHECK(out == std::vector<float>{1.0f, -2.0f});
  const auto bf16 = bytes_of({0x80, 0x3F, 0x40, 0xC0});
  dequantize_row(TensorType::BF16, bf16.data(), out.data(), 2);
  CHECK(out == std::vector<float>{1.0f, -3.0f});
}

TEST_CASE("q8_0 block: y = qs * d", "[gguf]") {
  auto block = bytes_of({0x00, 0x38});  // d = 0.5
  for (int j = 0; j < 32; ++j) block.push_back(std::byte(std::uint8_t(std::int8_t(j - 16))));
  const auto y = dequantize_block(TensorType::Q8_0, block);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == 0.5f * float(j - 16));
}

TEST_CASE("q4_0 block: low nibbles are elements 0-15, high nibbles 16-31, minus 8, times d", "[gguf]") {
  auto block = bytes_of({0x00, 0x34});  // d = 0.25
  for (int j = 0; j < 16; ++j) block.push_back(std::byte(std::uint8_t(j | ((15 - j) << 4))));
  const auto y = dequantize_block(TensorType::Q4_0, block);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == 0.25f * float(j - 8));
    CHECK(y[j + 16] == 0.25f * float(7 - j));
  }
}

TEST_CASE("q4_1 block: y = nibble * d + m", "[gguf]") {
  auto block = bytes_of({0x00, 0x38, 0x00, 0xBC});  // d = 0.5, m = -1
  for (int j = 0; j < 16; ++j) block.push_back(std::byte(std::uint8_t(j | ((15 - j) << 4))));
  const auto y = dequantize_block(TensorType::Q4_1, block);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == 0.5f * float(j) - 1.0f);
    CHECK(y[j + 16] == 0.5f * float(15 - j) - 1.0f);
  }
}

TEST_CASE("q5_0 and q5_1 blocks take the fifth bit of element j from bit j of qh", "[gguf]") {
  // qh = 0x5555AAAA: bit j set for odd j < 16 and for even j >= 16. qs[j] = j | j << 4.
  const auto qh = bytes_of({0xAA, 0xAA, 0x55, 0x55});
  std::vector<std::byte> qs;
  for (int j = 0; j < 16; ++j) qs.push_back(std::byte(std::uint8_t(j | (j << 4))));
  auto q5_0 = bytes_of({0x00, 0x3C});  // d = 1
  q5_0.insert(q5_0.end(), qh.begin(), qh.end());
  q5_0.insert(q5_0.end(), qs.begin(), qs.end());
  auto q5_1 = bytes_of({0x00, 0x38, 0x00, 0x40});  // d = 0.5, m = 2
  q5_1.insert(q5_1.end(), qh.begin(), qh.end());
  q5_1.insert(q5_1.end(), qs.begin(), qs.end());
  const auto y0 = dequantize_block(TensorType::Q5_0, q5_0);
  const auto y1 = dequantize_block(TensorType::Q5_1, q5_1);
  for (int j = 0; j < 16; ++j) {
    const int lo = j + (j % 2 == 1 ? 16 : 0), hi = j + (j % 2 == 0 ? 16 : 0);
    CHECK(y0[j] == float(lo - 16));
    CHECK(y0[j + 16] == float(hi - 16));
    CHECK(y1[j] == 0.5f * float(lo) + 2.0f);
    CHECK(y1[j + 16] == 0.5f * float(hi) + 2.0f);
  }
}

TEST_CASE("q6_k block: element e uses scale e / 16 and a 6-bit quant minus 32", "[gguf]") {
  std::vector<std::byte> block(210, std::byte{0});
  auto set = [&](int at, int v) { block[at] = std::byte(std::uint8_t(v)); };
  // Half 0: ql[0] = 0x3A (element 0 low nibble 0xA, element 64 low nibble 3), ql[32] = 0x5C
  // (element 32: 0xC, element 96: 5), qh[0] = 0b11100100 (high bits: e0 0, e32 1, e64 2, e96 3).
  set(0, 0x3A), set(32, 0x5C), set(128, 0xE4);
  // Half 1: ql[64 + 1] = 0xF0 (element 129: 0, element 193: 15), qh[32 + 1] = 0x30 (e193 high bits 3).
  set(65, 0xF0), set(128 + 33, 0x30);
  for (int k = 0; k < 16; ++k) set(192 + k, k - 8);  // signed scales -8..7
  set(208, 0x00), set(209, 0x38);                     // d = 0.5
  std::vector<int> q(256, -32);                       // every other element: quant 0 - 32
  q[0] = 0xA - 32, q[32] = (0xC | 1 << 4) - 32, q[64] = (3 | 2 << 4) - 32, q[96] = (5 | 3 << 4) - 32;
  q[129] = -32, q[193] = (15 | 3 << 4) - 32;
  const auto y = dequantize_block(TensorType::Q6_K, block);
  for (int e = 0; e < 256; ++e) {
    INFO("element " << e);
    CHECK(y[e] == 0.5f * float(e / 16 - 8) * float(q[e]));
  }
}

namespace {
// Q4_K/Q5_K scales: sc = {1, 2, 3, 4, 17, 33, 50, 63}, mn = {0, 5, 10, 63, 16, 1, 34, 7}, packed
// by hand: bytes 0-3 = sc[k] | hi2(sc[k+4]) << 6, bytes 4-7 = mn[k] | hi2(mn[k+4]) << 6,
// bytes 8-11 = lo4(sc[k+4]) | lo4(mn[k+4]) << 4.
const std::array<float, 8> k_sc = {1, 2, 3, 4, 17, 33, 50, 63};
const std::array<float, 8> k_mn = {0, 5, 10, 63, 16, 1, 34, 7};
std::vector<std::byte> k_scales() { return bytes_of({0x41, 0x82, 0xC3, 0xC4, 0x40, 0x05, 0x8A, 0x3F, 0x01, 0x11, 0x22, 0x7F}); }
/// Appends `count` quant bytes that differ at every index (i * 73 + 29 is a bijection mod 256), so that a
/// dequantiser reading the right bits of the wrong byte fails, and returns them.
std::vector<std::uint8_t> append_distinct_bytes(std::vector<std::byte>& block, int count) {
  std::vector<std::uint8_t> q(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    q[static_cast<std::size_t>(i)] = std::uint8_t((i * 73 + 29) % 256);
    block.push_back(std::byte{q[static_cast<std::size_t>(i)]});
  }
  return q;
}
}  // namespace

TEST_CASE("q4_k block: chunk c uses sub-blocks 2c and 2c+1, y = d*sc*q - dmin*mn", "[gguf]") {
  auto block = bytes_of({0x00, 0x38, 0x00, 0x34});  // d = 0.5, dmin = 0.25
  const auto scales = k_scales();
  block.insert(block.end(), scales.begin(), scales.end());
  const auto qs = append_distinct_bytes(block, 128);
  const auto y = dequantize_block(TensorType::Q4_K, block);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      INFO("chunk " << c << " l " << l);
      const std::uint8_t q = qs[static_cast<std::size_t>(32 * c + l)];  // low nibble: element l, high: 32 + l
      CHECK(y[64 * c + l] == 0.5f * k_sc[2 * c] * float(q & 15) - 0.25f * k_mn[2 * c]);
      CHECK(y[64 * c + 32 + l] == 0.5f * k_sc[2 * c + 1] * float(q >> 4) - 0.25f * k_mn[2 * c + 1]);
    }
  }
}

TEST_CASE("q5_k block: bit 2c of qh[l] extends the low nibble, bit 2c+1 the high nibble", "[gguf]") {
  auto block = bytes_of({0x00, 0x38, 0x00, 0x34});  // d = 0.5, dmin = 0.25
  const auto scales = k_scales();
  block.insert(block.end(), scales.begin(), scales.end());
  for (int l = 0; l < 32; ++l) block.push_back(std::byte(std::uint8_t(1u << (l % 8))));  // qh
  const auto qs = append_distinct_bytes(block, 128);
  const auto y = dequantize_block(TensorType::Q5_K, block);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      INFO("chunk " << c << " l " << l);
      const std::uint8_t q = qs[static_cast<std::size_t>(32 * c + l)];
      const float lo = float((q & 15) + (l % 8 == 2 * c ? 16 : 0));
      const float hi = float((q >> 4) + (l % 8 == 2 * c + 1 ? 16 : 0));
      CHECK(y[64 * c + l] == 0.5f * k_sc[2 * c] * lo - 0.25f * k_mn[2 * c]);
      CHECK(y[64 * c + 32 + l] == 0.5f * k_sc[2 * c + 1] * hi - 0.25f * k_mn[2 * c + 1]);
    }
  }
}

TEST_CASE("q2_k block: group e/16 scales the 2-bit quant of byte 32*(e/128)+e%32 at shift 2*((e%128)/32)",
          "[gguf]") {
  std::vector<std::byte> block;
  for (int g = 0; g < 16; ++g) block.push_back(std::byte(std::uint8_t((g % 7 + 1) | ((g % 3) << 4))));
  // Element e: byte 32 * (e / 128) + e % 32, at shift 2 * ((e % 128) / 32).
  const auto qs = append_distinct_bytes(block, 64);
  const auto tail = bytes_of({0x00, 0x38, 0x00, 0x34});  // d = 0.5, dmin = 0.25
  block.insert(block.end(), tail.begin(), tail.end());
  const auto y = dequantize_block(TensorType::Q2_K, block);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 16;
    const int q = (qs[static_cast<std::size_t>(32 * (e / 128) + e % 32)] >> (2 * ((e % 128) / 32))) & 3;
    INFO("element " << e);
    CHECK(y[e] == 0.5f * float(g % 7 + 1) * float(q) - 0.25f * float(g % 3));
  }
}

TEST_CASE("q3_k block: 6-bit scales minus 32, quant minus 4 unless its hmask bit is set", "[gguf]") {
  std::vector<std::byte> block;
  for (int i = 0; i < 32; ++i) block.push_back(std::byte(std::uint8_t(i < 16 ? 0x0F : 0xF0)));  // hmask
  // Element e: byte 32 * (e / 128) + e % 32, at shift 2 * ((e % 128) / 32).
  const auto qs = append_distinct_bytes(block, 64);
  // Stored scales 24 + k (k = 0..15): low nibbles (8+k) | k << 4 in bytes 0-7, high bits 1,1,2,2 -> 0xA5.
  for (int k = 0; k < 8; ++k) block.push_back(std::byte(std::uint8_t((8 + k) | (k << 4))));
  for (int i = 0; i < 4; ++i) block.push_back(std::byte{0xA5});
  const auto d = bytes_of({0x00, 0x38});  // d = 0.5
  block.insert(block.end(), d.begin(), d.end());
  const auto y = dequantize_block(TensorType::Q3_K, block);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, shift_index = (e % 128) / 32, bit = 4 * half + shift_index;
    const bool set = (e % 32 < 16) ? bit < 4 : bit >= 4;
    const int q = (qs[static_cast<std::size_t>(32 * half + e % 32)] >> (2 * shift_index)) & 3;
    INFO("element " << e);
    CHECK(y[e] == 0.5f * float(e / 16 - 8) * float(q - (set ? 0 : 4)));
  }
}

TEST_CASE("dequantize_row rejects a length that is not a whole number of blocks", "[gguf]") {
  std::vector<std::byte> block(18);
  std::vector<float> out(40);
  REQUIRE_THROWS_WITH(dequantize_row(TensorType::Q4_0, block.data(), out.data(), 40),
                      Contains("40 elements is not a multiple of the q4_0 block size 32"));
}

// ---------------------------------------------------------------------------------------------
// Round trips through the writer
// ---------------------------------------------------------------------------------------------

TEST_CASE("every metadata value type and array type reads back as written", "[gguf]") {
  const std::uint32_t version = GENERATE(2u, 3u);
  GgufWriter w(version);
  w.add_uint8("u8", 200);
  w.add_int8("i8", -100);
  w.add_uint16("u16", 60000);
  w.add_int16("i16", -30000);
  w.add_uint32("u32", 4000000000u);
  w.add_int32("i32", -2000000000);
  w.add_uint64("u64", 1ull << 60);
  w.add_int64("i64", -(1ll << 60));
  w.add_float32("f32", 0.25f);
  w.add_float64("f64", -1e300);
  w.add_bool("yes", true);
  w.add_bool("no", false);
  w.add_string("s", "hello");
  w.add_string("empty", "");
  w.add_array_strings("strings", {"x", "", "yz"});
  w.add_array_uint8("a_u8", std::vector<std::uint8_t>{1, 255});
  w.add_array_int8("a_i8", std::vector<std::int8_t>{-1, 2});
  w.add_array_uint16("a_u16", std::vector<std::uint16_t>{65535});
  w.add_array_int16("a_i16", std::vector<std::int16_t>{-32768});
  w.add_array_uint32("a_u32", std::vector<std::uint32_t>{7, 8, 9});
  w.add_array_int32("a_i32", std::vector<std::int32_t>{-7});
  w.add_array_uint64("a_u64", std::vector<std::uint64_t>{1ull << 62});
  w.add_array_int64("a_i64", std::vector<std::int64_t>{-(1ll << 62)});
  w.add_array_float32("a_f32", std::vector<float>{0.5f, -1.5f});
  w.add_array_float64("a_f64", std::vector<double>{1e-300});
  w.add_array_bool("a_bool", {true, false, true});
  w.add_array_int32("a_empty", std::vector<std::int32_t>{});
  const File f = parse(w.finish());

  CHECK(f.version() == version);
  CHECK(f.keys().size() == 27);
  CHECK(f.keys().front() == "u8");
  CHECK(f.type_of("i16") == ValueType::INT16);
  CHECK_FALSE(f.type_of("absent").has_value());
  CHECK(f.get_uint("u8") == 200);
  CHECK(f.get_int("i8") == -100);
  CHECK(f.get_uint("u16") == 60000);
  CHECK(f.get_int("i16") == -30000);
  CHECK(f.get_uint("u32") == 4000000000u);
  CHECK(f.get_int("i32") == -2000000000);
  CHECK(f.get_uint("u64") == 1ull << 60);
  CHECK(f.get_int("i64") == -(1ll << 60));
  CHECK(f.get_float("f32") == 0.25);
  CHECK(f.get_float("f64") == -1e300);
  CHECK(f.get_float("u32") == 4e9);  // integers accepted as numbers
  CHECK(f.get_bool("yes"));
  CHECK_FALSE(f.get_bool("no"));
  CHECK(f.get_string("s") == "hello");
  CHECK(f.get_string("empty").empty());
  CHECK(f.get_string_array("strings") == std::vector<std::string>{"x", "", "yz"});
  CHECK(f.array_size("strings") == 3);
  CHECK(f.array_type("strings") == ValueType::STRING);
  CHECK(f.get_int_array("a_u8") == std::vector<std::int64_t>{1, 255});
  CHECK(f.get_int_array("a_i8") == std::vector<std::int64_t>{-1, 2});
  CHECK(f.get_int_array("a_u16") == std::vector<std::int64_t>{65535});
  CHECK(f.get_int_array("a_i16") == std::vector<std::int64_t>{-32768});
  CHECK(f.get_int_array("a_u32") == std::vector<std::int64_t>{7, 8, 9});
  CHECK(f.get_int_array("a_i32") == std::vector<std::int64_t>{-7});
  CHECK(f.get_int_array("a_u64") == std::vector<std::int64_t>{1ll << 62});
  CHECK(f.get_int_array("a_i64") == std::vector<std::int64_t>{-(1ll << 62)});
  CHECK(f.get_float_array("a_f32") == std::vector<double>{0.5, -1.5});
  CHECK(f.get_float_array("a_f64") == std::vector<double>{1e-300});
  CHECK(f.get_bool_array("a_bool") == std::vector<bool>{true, false, true});
  CHECK(f.get_int_array("a_empty").empty());
  CHECK(f.find_uint("u32") == 4000000000u);
  CHECK_FALSE(f.find_uint("absent").has_value());
  CHECK(f.tensors().empty());
}

TEST_CASE("a row past a tensor's rows is an error, not a read out of bounds", "[gguf]") {
  GgufWriter w;
  w.add_tensor_quantized("t", {32, 3}, TensorType::Q8_0, ramp(96));
  const File f = parse(w.finish());
  const TensorInfo& t = f.tensors().at(0);
  std::vector<float> row(32);
  CHECK_NOTHROW(t.dequantize_row(2, row.data()));
  CHECK_THROWS_WITH(t.row_data(3), "tensor 't' has 3 rows, asked for row 3");
  CHECK_THROWS_WITH(t.dequantize_row(~std::uint64_t{0}, row.data()), Catch::Contains("asked for row 18446744073709551615"));
  TensorInfo short_data = t;  // a tensor built by hand, its data shorter than its dims say
  short_data.data = short_data.data.first(40);
  CHECK_THROWS_WITH(short_data.row_data(1), "tensor 't' has more rows than its 40 bytes of data hold (rows of 34 bytes)");
}

TEST_CASE("a tensor built by hand with a shape no file could have is an error, not a crash", "[gguf]") {
  GgufWriter w;
  w.add_tensor_quantized("t", {32, 3}, TensorType::Q8_0, ramp(96));
  const File f = parse(w.finish());
  const auto with_dims = [&](std::vector<std::uint64_t> dims, TensorType type = TensorType::Q8_0) {
    TensorInfo t = f.tensors().at(0);
    t.dims = std::move(dims), t.type = type;
    return t;
  };
  std::vector<float> row(32);
  const std::uint64_t huge = std::uint64_t{1} << 62;
  const auto throws = [&](const TensorInfo& t, const std::string& message) {
    CHECK_THROWS_WITH(t.row_data(0), message);
    CHECK_THROWS_WITH(t.dequantize_row(0, row.data()), message);
    CHECK_THROWS_WITH(dequantize(t), message);
  };
  throws(with_dims({}), "tensor 't' has 0 dimensions, expected 1 to 4");
  throws(with_dims({32, 1, 1, 1, 3}), "tensor 't' has 5 dimensions, expected 1 to 4");
  throws(with_dims({0}), "tensor 't' dimension 0 is 0, expected at least 1");
  throws(with_dims({32, 0}), "tensor 't' dimension 1 is 0, expected at least 1");
  throws(with_dims({31}), "tensor 't' of type 8 has no whole blocks in a row of 31 elements");
  throws(with_dims({huge}, TensorType::F32), "tensor 't' has rows of 4611686018427387904 elements, longer than its "
                                             "102 bytes of data");
  throws(with_dims({32, huge, huge}), "tensor 't' has more rows than its 102 bytes of data hold (rows of 34 bytes)");
  CHECK(dequantize(with_dims({32, 3})).size() == 96);
}

TEST_CASE("tensors of every writable type read back at the requested alignment", "[gguf]") {
  const std::uint32_t version = GENERATE(2u, 3u);
  const std::uint32_t alignment = GENERATE(32u, 64u);
  GgufWriter w(version);
  if (alignment != 32) w.set_alignment(alignment);
  w.add_string("general.architecture", "llama");
  const auto values = ramp(96);  // 3 rows of 32
  const std::array types = {TensorType::F32, TensorType::F16, TensorType::BF16,
                            TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1};
  for (auto type : types) w.add_tensor_quantized(std::string(type_name(type)), {32, 3}, type, values);
  const auto bytes = w.finish();
  const File f = parse(bytes);

  CHECK(f.version() == version);
  CHECK(f.alignment() == alignment);
  CHECK(f.data_offset() % alignment == 0);
  REQUIRE(f.tensors().size() == types.size());
  for (std::size_t i = 0; i < types.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    INFO(t.name);
    CHECK(t.name == type_name(types[i]));
    CHECK(t.type == types[i]);
    CHECK(t.dims == std::vector<std::uint64_t>{32, 3});
    CHECK(t.elements() == 96);
    CHECK(t.rows() == 3);
    CHECK(t.row_bytes() == 32 / block_size(t.type) * type_size(t.type));
    CHECK(t.offset % alignment == 0);
    CHECK(std::size_t(t.data.data() - f.bytes().data()) == f.data_offset() + t.offset);
    const auto got = dequantize(t);
    // Tolerance per type: exact for f32, half an ulp for f16/bf16, about half a step for the quants.
    const double tolerance = t.type == TensorType::F32 ? 0.0 : t.type == TensorType::F16 ? 1e-3
                           : t.type == TensorType::BF16 ? 8e-3 : t.type == TensorType::Q8_0 ? 8e-3
                           : t.type == TensorType::Q4_0 ? 0.25 : 0.13;
    for (std::size_t j = 0; j < values.size(); ++j) REQUIRE(std::fabs(got[j] - values[j]) <= tolerance);
  }
  CHECK(&f.tensor("q4_1") == &f.tensors()[5]);
  CHECK(f.find_tensor("absent") == nullptr);
}

TEST_CASE("a file opened from disk is memory-mapped and survives a move", "[gguf]") {
  const auto path = std::filesystem::temp_directory_path() / "specdec_test_gguf_open.gguf";
  small_model().write(path);
  File f = File::open(path);
  CHECK(f.name() == path.string());
  const std::byte* data = f.tensor("norm").data.data();
  File moved = std::move(f);
  CHECK(moved.tensor("norm").data.data() == data);
  std::vector<float> row(8);
  moved.tensor("norm").dequantize_row(0, row.data());
  CHECK(row == ramp(8));
  CHECK(moved.get_string_views("tokenizer.ggml.tokens")[2] == "ab");
  std::filesystem::remove(path);
  REQUIRE_THROWS_WITH(File::open(path), Contains("cannot open gguf file") && Contains("specdec_test_gguf_open"));
}

TEST_CASE("a string array whose file changed on disk after opening is an error, not a read out of bounds", "[gguf]") {
  // The tokens "a", "b", "ab": each a length (8 bytes, little-endian) and its text, 28 bytes in all. The mapping
  // shows what is written to the file after it was opened.
  const auto path = std::filesystem::temp_directory_path() / "specdec_test_gguf_changed.gguf";
  small_model().write(path);
  const File f = File::open(path);
  REQUIRE(f.get_string_views("tokenizer.ggml.tokens")[2] == "ab");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t b = bytes.find(std::string("\x01\0\0\0\0\0\0\0b\x02\0\0\0\0\0\0\0ab", 19));
  REQUIRE(b != std::string::npos);
  const auto write_byte = [&](std::size_t at, char value) {
    std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
    out.seekp(std::streamoff(at));
    out.put(value);
  };
  const auto fails_at = [&](int string) {
    CHECK_THROWS_WITH(f.get_string_views("tokenizer.ggml.tokens"),
                      Contains("key 'tokenizer.ggml.tokens' string " + std::to_string(string) +
                               " no longer fits its array") && Contains("specdec_test_gguf_changed"));
  };
  write_byte(b + 9 + 5, '\x01');  // token 2's length 2^40 + 2
  fails_at(2);
  write_byte(b + 9 + 5, '\0');
  // Token 1's length 2 to 11 leaves token 2's length field 9 bytes down to none: from 4 on, fewer than its 8
  // (7 at 4: a sentinel length of 2^64 - 1 passed a check that took 7 - 8 in unsigned arithmetic).
  for (char length = 2; length <= 11; ++length) {
    CAPTURE(int(length));
    write_byte(b, length);
    fails_at(2);
  }
  write_byte(b, 12);  // token 1 itself runs past the array
  fails_at(1);
  write_byte(b, 1);
  CHECK(f.get_string_views("tokenizer.ggml.tokens")[2] == "ab");
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------------------------
// Metadata access errors
// ---------------------------------------------------------------------------------------------

TEST_CASE("an error that quotes the file's text escapes its control bytes, so it stays on one line", "[gguf]") {
  GgufWriter w;
  w.add_string("line\nbreak\x1b[2J\x7f", "x");  // a newline, a terminal's clear-screen sequence, DEL
  const File f = parse(w.finish());
  REQUIRE_THROWS_WITH(f.get_uint("line\nbreak\x1b[2J\x7f"),
                      "test.gguf: key 'line\\nbreak\\x1b[2J\\x7f' has type string, expected an integer");
}

TEST_CASE("an error escapes C1 controls and bytes that are not UTF-8, and keeps well-formed characters", "[gguf]") {
  // U+009B (C1 CSI, which some terminals take as ESC [), a lone continuation byte, a truncated 3-byte character,
  // an overlong '/', a surrogate; then é, €, 𝄞 and U+00A0, which stay.
  const std::string key = "a\xc2\x9b" "2Jb\x80" "c\xe2\x82" "d\xc0\xaf" "e\xed\xa0\x80"
                          "f\xc3\xa9\xe2\x82\xac\xf0\x9d\x84\x9e\xc2\xa0";
  GgufWriter w;
  w.add_string(key, "x");
  const File f = parse(w.finish());
  REQUIRE_THROWS_WITH(f.get_uint(key), "test.gguf: key 'a\\xc2\\x9b2Jb\\x80c\\xe2\\x82d\\xc0\\xafe\\xed\\xa0\\x80f"
                                       "\xc3\xa9\xe2\x82\xac\xf0\x9d\x84\x9e\xc2\xa0' has type string, expected an integer");
}

TEST_CASE("metadata getters name the key and the expected type", "[gguf]") {
  GgufWriter w;
  w.add_string("s", "x");
  w.add_int32("neg", -3);
  w.add_uint64("huge", ~0ull);
  w.add_array_uint64("huge_array", std::vector<std::uint64_t>{~0ull});
  w.add_array_strings("strings", {"a"});
  const File f = parse(w.finish());
  REQUIRE_THROWS_WITH(f.get_uint("nope"), "test.gguf: missing key 'nope'");
  REQUIRE_THROWS_WITH(f.get_uint("s"), "test.gguf: key 's' has type string, expected an integer");
  REQUIRE_THROWS_WITH(f.find_uint("s"), Contains("key 's' has type string"));
  REQUIRE_THROWS_WITH(f.get_uint("neg"), "test.gguf: key 'neg' is -3, expected a non-negative integer");
  REQUIRE_THROWS_WITH(f.get_int("huge"), Contains("key 'huge' is 18446744073709551615"));
  REQUIRE_THROWS_WITH(f.get_int_array("huge_array"), Contains("key 'huge_array' element 0"));
  REQUIRE_THROWS_WITH(f.get_string("neg"), "test.gguf: key 'neg' has type int32, expected string");
  REQUIRE_THROWS_WITH(f.get_bool("s"), Contains("expected bool"));
  REQUIRE_THROWS_WITH(f.get_float("s"), Contains("expected a number"));
  REQUIRE_THROWS_WITH(f.get_string_array("s"), Contains("key 's' has type string, expected array"));
  REQUIRE_THROWS_WITH(f.get_int_array("strings"),
                      "test.gguf: key 'strings' is an array of string, expected an array of an integer type");
  REQUIRE_THROWS_WITH(f.get_float_array("strings"), Contains("expected an array of a number type"));
  REQUIRE_THROWS_WITH(f.tensor("blk.0.attn_q.weight"), "test.gguf: missing tensor 'blk.0.attn_q.weight'");
}

// ---------------------------------------------------------------------------------------------
// Malformed files
// ---------------------------------------------------------------------------------------------

TEST_CASE("a bad magic or an unsupported version is rejected", "[gguf]") {
  auto bytes = small_model().finish();
  auto bad_magic = bytes;
  bad_magic[0] = std::byte{'X'};
  REQUIRE_THROWS_WITH(parse(bad_magic), Contains("test.gguf: bad magic") && Contains("expected 0x46554747"));
  for (std::uint32_t version : {0u, 1u, 4u, 1000u}) {
    auto v = bytes;
    patch(v, 4, version);
    REQUIRE_THROWS_WITH(parse(v), "test.gguf: unsupported gguf version " + std::to_string(version) + ", expected 2 or 3");
  }
  patch(bytes, 4, std::uint32_t(0x03000000));
  REQUIRE_THROWS_WITH(parse(bytes), Contains("byte-swapped"));
}

TEST_CASE("truncating a valid file at every byte offset gives an error", "[gguf]") {
  const auto bytes = small_model().finish();
  const File whole = parse(bytes);
  const auto& last = whole.tensors().back();
  REQUIRE(whole.data_offset() + last.offset + last.data.size() == bytes.size());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " of " << bytes.size() << " bytes");
    REQUIRE_THROWS_AS(parse({bytes.begin(), bytes.begin() + std::ptrdiff_t(n)}), Error);
  }
  // Early truncations fail the count check (5 entries cannot fit); a one-key file reaches the reads.
  REQUIRE_THROWS_WITH(parse({bytes.begin(), bytes.begin() + 30}),
                      "test.gguf: header: metadata count 5 needs at least 14 bytes each, only 6 bytes remain at byte 24");
  GgufWriter one;
  one.add_string("general.architecture", "llama");
  const auto small = one.finish();
  REQUIRE(small.size() == 69);
  REQUIRE_THROWS_WITH(parse({small.begin(), small.begin() + 40}),
                      "test.gguf: metadata entry 0: key of 20 bytes at byte 32 runs past the end of the file (40 bytes)");
  REQUIRE_THROWS_WITH(parse({small.begin(), small.begin() + 54}),
                      "test.gguf: key 'general.architecture': value type of 4 bytes at byte 52 runs past the end of the file (54 bytes)");
  REQUIRE_THROWS_WITH(parse({small.begin(), small.begin() + 66}),
                      "test.gguf: key 'general.architecture': string of 5 bytes at byte 64 runs past the end of the file (66 bytes)");
  REQUIRE_THROWS_WITH(parse({bytes.begin(), bytes.end() - 1}),
                      Contains("tensor 'norm' data ends at byte " + std::to_string(bytes.size())) &&
                          Contains("file has " + std::to_string(bytes.size() - 1) + " bytes"));
}

TEST_CASE("huge counts and lengths are checked against the remaining bytes before use", "[gguf]") {
  const auto bytes = small_model().finish();
  auto tensors = bytes;
  patch(tensors, 8, std::uint64_t(1) << 60);
  REQUIRE_THROWS_WITH(parse(tensors), Contains("tensor count 1152921504606846976 needs at least 32 bytes each"));
  auto kvs = bytes;
  patch(kvs, 16, std::uint64_t(1) << 62);
  REQUIRE_THROWS_WITH(parse(kvs), Contains("metadata count 4611686018427387904"));
  auto key = bytes;
  patch(key, 24, std::uint64_t(1) << 63);
  REQUIRE_THROWS_WITH(parse(key), "test.gguf: metadata entry 0: key of 9223372036854775808 bytes at byte 32 runs past the end of the file (" + std::to_string(bytes.size()) + " bytes)");

  GgufWriter w;
  std::vector<std::byte> value;
  append(value, std::uint32_t(ValueType::UINT32));
  append(value, std::uint64_t(1) << 62);
  w.add_raw("big_array", std::uint32_t(ValueType::ARRAY), value);
  REQUIRE_THROWS_WITH(parse(w.finish()), Contains("key 'big_array': array element count 4611686018427387904"));

  GgufWriter s;
  std::vector<std::byte> strings;
  append(strings, std::uint32_t(ValueType::STRING));
  append(strings, std::uint64_t(2));
  append(strings, std::uint64_t(1));
  strings.push_back(std::byte{'a'});
  append(strings, ~std::uint64_t(0));  // second string's length: 2^64 - 1
  s.add_raw("strings", std::uint32_t(ValueType::ARRAY), strings);
  REQUIRE_THROWS_WITH(parse(s.finish()), Contains("key 'strings': array string of 18446744073709551615 bytes"));
}

TEST_CASE("bad metadata entries are rejected with the key named", "[gguf]") {
  SECTION("unknown value type") {
    GgufWriter w;
    w.add_raw("k", 13, bytes_of({0, 0, 0, 0}));
    REQUIRE_THROWS_WITH(parse(w.finish()), "test.gguf: key 'k' has unknown value type 13, expected 0 to 12");
  }
  SECTION("nested array") {
    GgufWriter w;
    std::vector<std::byte> v;
    append(v, std::uint32_t(ValueType::ARRAY));
    append(v, std::uint64_t(0));
    w.add_raw("nested", std::uint32_t(ValueType::ARRAY), v);
    REQUIRE_THROWS_WITH(parse(w.finish()), "test.gguf: key 'nested': nested arrays are not supported");
  }
  SECTION("unknown array element type") {
    GgufWriter w;
    std::vector<std::byte> v;
    append(v, std::uint32_t(77));
    append(v, std::uint64_t(0));
    w.add_raw("a", std::uint32_t(ValueType::ARRAY), v);
    REQUIRE_THROWS_WITH(parse(w.finish()), Contains("key 'a' has unknown array element type 77"));
  }
  SECTION("duplicate key") {
    GgufWriter w;
    w.add_uint32("k", 1);
    w.add_string("k", "again");
    REQUIRE_THROWS_WITH(parse(w.finish()), "test.gguf: duplicate key 'k'");
  }
  SECTION("empty key") {
    GgufWriter w;
    w.add_uint32("", 1);
    REQUIRE_THROWS_WITH(parse(w.finish()), "test.gguf: metadata entry 0 has an empty key");
  }
  SECTION("bool other than 0 or 1") {
    GgufWriter w;
    w.add_raw("b", std::uint32_t(ValueType::BOOL), bytes_of({2}));
    REQUIRE_THROWS_WITH(parse(w.finish()), "test.gguf: key 'b' bool value is 2, expected 0 or 1");
  }
  SECTION("general.alignment of the wrong type") {
    GgufWriter w;
    w.add_uint64("general.alignment", 32);
    REQUIRE_THROWS_WITH(parse(w.finish()), "test.gguf: key 'general.alignment' has type uint64, expected uint32");
  }
  SECTION("general.alignment not a power of two") {
    for (std::uint32_t a : {0u, 48u}) {
      GgufWriter w;
      w.add_uint32("general.alignment", a);
      REQUIRE_THROWS_WITH(parse(w.finish()),
                          "test.gguf: key 'general.alignment' is " + std::to_string(a) + ", expected a power of two");
    }
  }
}

TEST_CASE("bad tensor infos are rejected with the tensor named", "[gguf]") {
  GgufWriter w;
  auto raw = [&](GgufWriter::RawTensor t) {
    GgufWriter copy = w;
    copy.add_tensor_raw(std::move(t));
    return parse(copy.finish());
  };
  const std::vector<std::byte> data(64);
  SECTION("unknown tensor type") {
    REQUIRE_THROWS_WITH(raw({"t", {32}, 9, data, {}}),
                        "test.gguf: tensor 't' has unknown tensor type 9, expected one of f32 (0), f16 (1), q4_0 (2), "
                        "q4_1 (3), q5_0 (6), q5_1 (7), q8_0 (8), q2_k (10), q3_k (11), q4_k (12), q5_k (13), q6_k (14), "
                        "bf16 (30)");
    REQUIRE_THROWS_WITH(raw({"t", {32}, 1000, data, {}}),
                        Catch::StartsWith("test.gguf: tensor 't' has unknown tensor type 1000, expected one of f32 (0)"));
  }
  SECTION("zero dimension") {
    REQUIRE_THROWS_WITH(raw({"t", {4, 0}, 0, data, {}}), "test.gguf: tensor 't' dimension 1 is 0, expected at least 1");
  }
  SECTION("dimension count out of range") {
    REQUIRE_THROWS_WITH(raw({"t", {}, 0, data, {}}), "test.gguf: tensor 't' has 0 dimensions, expected 1 to 4");
    REQUIRE_THROWS_WITH(raw({"t", {1, 1, 1, 1, 1}, 0, data, {}}), Contains("has 5 dimensions, expected 1 to 4"));
  }
  SECTION("element count overflow") {
    REQUIRE_THROWS_WITH(raw({"t", {1ull << 32, 1ull << 32}, 0, data, {}}),
                        "test.gguf: tensor 't' element count overflows at dimension 1 (4294967296)");
    REQUIRE_THROWS_WITH(raw({"t", {1ull << 62, 4}, 0, data, {}}), Contains("element count overflows"));
  }
  SECTION("byte size overflow") {
    REQUIRE_THROWS_WITH(raw({"t", {1ull << 62}, 0, data, {}}), Contains("tensor 't' data (offset 0) ends past byte 2^64"));
  }
  SECTION("row length not a multiple of the block size") {
    REQUIRE_THROWS_WITH(raw({"t", {48, 2}, std::uint32_t(TensorType::Q4_0), data, {}}),
                        "test.gguf: tensor 't' row length 48 is not a multiple of the q4_0 block size 32");
  }
  SECTION("data past the end of the file") {
    REQUIRE_THROWS_WITH(raw({"t", {16}, 0, data, 4096}),
                        Contains("tensor 't' data ends at byte ") && Contains(", file has "));
    REQUIRE_THROWS_WITH(raw({"t", {16}, 0, data, ~std::uint64_t(31)}), Contains("tensor 't' data (offset 18446744073709551584) ends past byte 2^64"));
  }
  SECTION("misaligned offset") {
    REQUIRE_THROWS_WITH(raw({"t", {4}, 0, data, 4}), "test.gguf: tensor 't' offset 4 is not a multiple of the alignment 32");
  }
  SECTION("duplicate tensor") {
    w.add_tensor_f32("t", {4}, ramp(4));
    REQUIRE_THROWS_WITH(raw({"t", {4}, 0, data, {}}), "test.gguf: duplicate tensor 't'");
  }
  SECTION("tensors sharing bytes") {
    w.add_tensor_f32("a", {16}, ramp(16));  // 64 bytes at offset 0
    REQUIRE_THROWS_WITH(raw({"b", {8}, 0, data, 32}),
                        "test.gguf: tensor 'b' data (offset 32) overlaps tensor 'a' (offset 0, 64 bytes)");
    REQUIRE_NOTHROW(raw({"b", {8}, 0, data, 64}));
  }
  SECTION("name longer than 63 bytes") {
    REQUIRE_THROWS_WITH(raw({std::string(64, 'n'), {4}, 0, data, {}}), Contains("name has 64 bytes, at most 63 allowed"));
  }
}

TEST_CASE("random byte corruption of a valid file never crashes", "[gguf]") {
  const auto bytes = small_model().finish();
  std::mt19937 rng(1234);
  std::vector<float> row(64);
  for (int trial = 0; trial < 3000; ++trial) {
    auto corrupt = bytes;
    const int flips = 1 + int(rng() % 4);
    for (int i = 0; i < flips; ++i) corrupt[rng() % corrupt.size()] = std::byte(std::uint8_t(rng()));
    try {
      const File f = parse(std::move(corrupt));
      for (auto key : f.keys()) (void)f.type_of(key);
      for (const auto& t : f.tensors()) {
        row.resize(std::size_t(t.row_length()));
        t.dequantize_row(0, row.data());
      }
    } catch (const Error&) {
    }
  }
  SUCCEED();
}

// ---------------------------------------------------------------------------------------------
// Fuzz seeds and the real model
// ---------------------------------------------------------------------------------------------

namespace {
const std::filesystem::path corpus_dir = std::filesystem::path(SPECDEC_TEST_DATA) / ".." / "fuzz" / "corpus";

/// A whole llama at the smallest size the kernels take (embedding 32, one layer, 2 query heads over 1 kv head of
/// 16 dims, vocabulary of 10) with a byte-level BPE tokenizer: the fuzz target's seed for the model and tokenizer
/// loaders and a forward pass.
std::vector<std::byte> tiny_llama_with_tokenizer() {
  const std::uint32_t e = 32, vocab = 10;
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  const std::pair<const char*, std::uint32_t> sizes[] = {
      {"llama.context_length", 16}, {"llama.embedding_length", e}, {"llama.block_count", 1},
      {"llama.feed_forward_length", 32}, {"llama.attention.head_count", 2}, {"llama.attention.head_count_kv", 1},
      {"llama.rope.dimension_count", 16}, {"llama.vocab_size", vocab}};
  for (const auto& [key, value] : sizes) w.add_uint32(key, value);
  w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "smollm");
  // In the byte-level alphabet "Ġ" is the space, and "Ã" and "©" are the two bytes of "é".
  w.add_array_strings("tokenizer.ggml.tokens", {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab",
                                                "\xC4\xA0", "\xC4\xA0" "a", "\xC3\x83", "\xC2\xA9"});
  const std::int32_t types[] = {3, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  w.add_array_int32("tokenizer.ggml.token_type", types);
  w.add_array_strings("tokenizer.ggml.merges", {"a b", "\xC4\xA0 a"});
  w.add_uint32("tokenizer.ggml.bos_token_id", 1);
  w.add_uint32("tokenizer.ggml.eos_token_id", 2);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  const auto add = [&](const std::string& name, std::vector<std::uint64_t> dims, TensorType type) {
    std::vector<float> values(dims.size() == 1 ? dims[0] : dims[0] * dims[1]);
    for (float& v : values) v = normal(rng) + (dims.size() == 1 ? 1.0f : 0.0f);
    w.add_tensor_quantized(name, dims, type, values);
  };
  add("token_embd.weight", {e, vocab}, TensorType::Q8_0);
  add("blk.0.attn_norm.weight", {e}, TensorType::F32);
  add("blk.0.attn_q.weight", {e, 32}, TensorType::Q4_1);
  add("blk.0.attn_k.weight", {e, 16}, TensorType::Q4_0);
  add("blk.0.attn_v.weight", {e, 16}, TensorType::F16);
  add("blk.0.attn_output.weight", {32, e}, TensorType::BF16);
  add("blk.0.ffn_norm.weight", {e}, TensorType::F32);
  add("blk.0.ffn_gate.weight", {e, 32}, TensorType::Q8_0);
  add("blk.0.ffn_up.weight", {e, 32}, TensorType::Q4_1);
  add("blk.0.ffn_down.weight", {32, e}, TensorType::F32);
  add("output_norm.weight", {e}, TensorType::F32);
  return w.finish();
}

// Seeds for tests/fuzz (named .bin because .gitignore ignores *.gguf): valid files covering every value type, every tensor type, v2 and alignment 64.
std::vector<std::pair<std::string, std::vector<std::byte>>> fuzz_seeds() {
  std::vector<std::pair<std::string, std::vector<std::byte>>> seeds;
  seeds.emplace_back("small_v3.bin", small_model(3).finish());
  seeds.emplace_back("small_v2.bin", small_model(2).finish());
  GgufWriter meta;
  meta.set_alignment(64);
  meta.add_uint8("u8", 1), meta.add_int8("i8", -1), meta.add_uint16("u16", 2), meta.add_int16("i16", -2);
  meta.add_uint32("u32", 3), meta.add_int32("i32", -3), meta.add_uint64("u64", 4), meta.add_int64("i64", -4);
  meta.add_float32("f32", 0.5f), meta.add_float64("f64", 0.25), meta.add_bool("b", true), meta.add_string("s", "str");
  meta.add_array_strings("as", {"a", "bc"});
  meta.add_array_float32("af", std::vector<float>{1.0f}), meta.add_array_bool("ab", {true});
  meta.add_tensor_f16("f16", {4, 2}, ramp(8));
  seeds.emplace_back("metadata_align64.bin", meta.finish());
  GgufWriter quants;
  std::mt19937 rng(7);
  for (auto type : {TensorType::BF16, TensorType::Q4_0, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K,
                    TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    std::vector<std::byte> raw(type_size(type) * (block_size(type) == 1 ? 32 : 1));
    for (auto& b : raw) b = std::byte(std::uint8_t(rng()));
    const std::uint64_t n = block_size(type) == 1 ? 32 : block_size(type);
    quants.add_tensor(std::string(type_name(type)), {n}, type, raw);
  }
  seeds.emplace_back("all_quants.bin", quants.finish());
  seeds.emplace_back("tiny_llama.bin", tiny_llama_with_tokenizer());
  return seeds;
}
}  // namespace

TEST_CASE("the committed fuzz seeds are the ones the generator makes", "[gguf]") {
  for (const auto& [name, bytes] : fuzz_seeds()) {
    INFO(name << " (regenerate with: specdec_llama_tests \"[fuzz-corpus]\")");
    std::ifstream in(corpus_dir / name, std::ios::binary);
    REQUIRE(in.good());
    const std::vector<char> stored{std::istreambuf_iterator<char>(in), {}};
    REQUIRE(stored.size() == bytes.size());
    CHECK(std::memcmp(stored.data(), bytes.data(), bytes.size()) == 0);
    CHECK_NOTHROW(parse(bytes));
  }
}

TEST_CASE("the tiny llama fuzz seed loads as a model and a tokenizer, so the fuzzer starts past them", "[gguf]") {
  using namespace specdec::llama;
  const File file = File::from_bytes(tiny_llama_with_tokenizer(), "tiny_llama.bin");
  for (const WeightFormat format : {WeightFormat::f32, WeightFormat::quantized_dot}) {
    LlamaModel model(LlamaWeights::load(file, format), 8, nullptr);
    const specdec::Token tokens[] = {0, 9};
    const auto& logits = model.forward(tokens);
    REQUIRE(logits.rows() == 2);
    REQUIRE(logits.cols() == 10);
    CHECK(std::isfinite(logits(1, 9)));
  }
  const Tokenizer tokenizer = Tokenizer::from_gguf(file);
  const std::vector<specdec::Token> expected = {1, 5, 7, 8, 9, 2};  // <|im_start|> ab Ġa Ã © <|im_end|>
  CHECK(tokenizer.encode("<|im_start|>ab a\xC3\xA9<|im_end|>") == expected);
  CHECK(tokenizer.decode(expected) == "ab a\xC3\xA9");  // control tokens decode to nothing
}

TEST_CASE("write the fuzz seed corpus", "[.][fuzz-corpus]") {
  std::filesystem::create_directories(corpus_dir);
  for (const auto& [name, bytes] : fuzz_seeds()) {
    std::ofstream out(corpus_dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    REQUIRE(out.good());
  }
}

TEST_CASE("the SmolLM2 file has the expected header, metadata and tensors", "[gguf]") {
  const std::filesystem::path path = SPECDEC_MODEL_PATH;
  if (!std::filesystem::exists(path)) FAIL("model file " << path << " is missing: run scripts/fetch-model");
  const File f = File::open(path);
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.tensors().size() == 272);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_uint("llama.block_count") == 30);
  CHECK(f.get_uint("llama.embedding_length") == 576);
  CHECK(f.get_uint("llama.attention.head_count") == 9);
  CHECK(f.get_uint("llama.attention.head_count_kv") == 3);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon") == Approx(1e-5));
  CHECK(f.get_float("llama.rope.freq_base") == 100000.0);
  CHECK(f.get_uint("general.file_type") == 3);
  CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
  CHECK(f.array_size("tokenizer.ggml.tokens") == 49152);
  CHECK(f.get_string_array("tokenizer.ggml.tokens")[1] == "<|im_start|>");
  CHECK(f.get_int_array("tokenizer.ggml.token_type").size() == 49152);
  CHECK(f.array_size("tokenizer.ggml.merges") == 48900);
  CHECK(f.find_tensor("output.weight") == nullptr);

  const auto& embd = f.tensor("token_embd.weight");
  CHECK(embd.type == TensorType::Q8_0);
  CHECK(embd.dims == std::vector<std::uint64_t>{576, 49152});
  const auto& q = f.tensor("blk.0.attn_q.weight");
  CHECK(q.type == TensorType::Q4_1);
  CHECK(q.dims == std::vector<std::uint64_t>{576, 576});
  CHECK(f.tensor("blk.29.ffn_down.weight").dims == std::vector<std::uint64_t>{1536, 576});
  CHECK(f.tensor("output_norm.weight").type == TensorType::F32);

  for (const TensorInfo* t : {&embd, &q, &f.tensor("blk.29.ffn_norm.weight")}) {
    std::vector<float> row(std::size_t(t->row_length()));
    double sum_squares = 0, max_abs = 0;
    t->dequantize_row(t->rows() - 1, row.data());
    for (float x : row) {
      REQUIRE(std::isfinite(x));
      sum_squares += double(x) * x, max_abs = std::max(max_abs, double(std::fabs(x)));
    }
    INFO(t->name);
    CHECK(max_abs < 50.0);
    CHECK(std::sqrt(sum_squares / double(row.size())) > 1e-3);
  }
}
