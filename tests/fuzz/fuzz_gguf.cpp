// libFuzzer target for the GGUF reader and what loads from it: parse arbitrary bytes, read every metadata value
// with the getter its type calls for (and a few that must refuse it), dequantise the first and last row of every
// tensor; then load a llama model from the file (its config, weights in two formats, a model of 8 positions and a
// two-position forward) and its tokenizer (encode and decode). Only specdec::Error may escape; anything else (a
// crash, a sanitizer report, another exception, an allocation past -rss_limit_mb) is a bug. Build and run: see
// tests/fuzz/CMakeLists.txt.
#include <specdec/llama/gguf.hpp>
#include <specdec/llama/llama_model.hpp>
#include <specdec/llama/tokenizer.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
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

/// Loads a model from the file and runs it on two tokens; errors for a file that is no llama are expected.
void load_model(const File& file, specdec::llama::WeightFormat format) {
  using namespace specdec::llama;
  try {
    static const auto pool = std::make_shared<ThreadPool>(1);
    LlamaModel model(LlamaWeights::load(file, format), 8, pool);
    const specdec::Token tokens[] = {0, static_cast<specdec::Token>(model.config().vocab - 1)};
    (void)model.forward(tokens);
  } catch (const specdec::Error&) {
  }
}

/// Reads the tokenizer and runs it on text with special tokens, spaces, digits and a two-byte character.
void load_tokenizer(const File& file) {
  try {
    const auto tokenizer = specdec::llama::Tokenizer::from_gguf(file);
    const auto tokens = tokenizer.encode("<|im_start|>ab a 12 \xC3\xA9<|im_end|>");
    (void)tokenizer.decode(tokens);
  } catch (const specdec::Error&) {
  }
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
    load_model(file, specdec::llama::WeightFormat::f32);
    load_model(file, specdec::llama::WeightFormat::quantized_dot);
    load_tokenizer(file);
  } catch (const specdec::Error&) {
  }
  return 0;
}
