// libFuzzer target for the GGUF reader: parse arbitrary bytes, read every metadata value with the
// getter its type calls for (and a few that must refuse it), dequantise the first and last row of
// every tensor. Only specdec::Error may escape File; anything else (a crash, a sanitizer report, an
// unexpected exception) is a bug. Build and run: see tests/fuzz/CMakeLists.txt.
#include <specdec/llama/gguf.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

using namespace specdec::gguf;

namespace {

void touch_value(const File& file, std::string_view key) {
  const auto type = file.type_of(key);
  if (!type) __builtin_trap();
  try {
    switch (*type) {
      case ValueType::STRING: (void)file.get_string(key); break;
      case ValueType::BOOL: (void)file.get_bool(key); break;
      case ValueType::FLOAT32: case ValueType::FLOAT64: (void)file.get_float(key); break;
      case ValueType::ARRAY:
        (void)file.array_size(key);
        switch (file.array_type(key)) {
          case ValueType::STRING: (void)file.get_string_array(key); break;
          case ValueType::BOOL: (void)file.get_bool_array(key); break;
          case ValueType::FLOAT32: case ValueType::FLOAT64: (void)file.get_float_array(key); break;
          default: (void)file.get_int_array(key); (void)file.get_float_array(key); break;
        }
        break;
      default: (void)file.get_int(key); (void)file.get_float(key); break;
    }
  } catch (const specdec::Error&) {
    // Only integer overflow (a uint64 above INT64_MAX) may refuse a value of the matching type.
  }
  try { (void)file.get_uint(key); } catch (const specdec::Error&) {}
  try { (void)file.get_string_views(key); } catch (const specdec::Error&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = std::byte(data[i]);
  try {
    const File file = File::from_bytes(std::move(bytes), "fuzz.gguf");
    for (auto key : file.keys()) touch_value(file, key);
    (void)file.alignment();
    std::vector<float> row;
    for (const TensorInfo& t : file.tensors()) {
      if (file.find_tensor(t.name) != &t) __builtin_trap();
      row.resize(std::size_t(t.row_length()));
      t.dequantize_row(0, row.data());
      t.dequantize_row(t.rows() - 1, row.data());
    }
  } catch (const specdec::Error&) {
  }
  return 0;
}
