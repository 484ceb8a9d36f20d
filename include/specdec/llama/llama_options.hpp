// specdec/llama/llama_options.hpp — how a LlamaModel is loaded and what its forward calls report: the KV
// cache's element (KvFormat), LoadOptions, and ForwardProfile (time per stage).
// Entry points: LoadOptions, KvFormat, ForwardProfile. Read next: llama_model.hpp.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "specdec/llama/llama_weights.hpp"

namespace specdec::llama {

/// How the KV cache stores keys and values. f16 (IEEE half precision, rounded to nearest even, as llama.cpp's
/// default cache) halves the bytes attention reads per token and the cache's memory; a key or value beyond
/// ±65504 becomes ±inf there (as in llama.cpp), where f32 keeps them exactly as computed. q8 stores each
/// position's key row and value row of each kv head as 8-bit integers and a float scale each
/// (detail::quantize_kv_row: max |x| / 127, rounded to nearest, ties to even; like llama.cpp's q8_0 cache, but
/// one block per row, a float scale and ties to even): about half the bytes of f16 (68 against 128 a row at
/// head_dim 64), for long contexts, where attention reads more than the weights; each value within half its
/// row's scale. Every format keeps a position's logits independent of batching and threads.
enum class KvFormat { f32, f16, q8 };

inline const char* to_string(KvFormat format) {
  return format == KvFormat::f16 ? "f16" : format == KvFormat::q8 ? "q8" : "f32";
}
/// The KvFormat named "f16", "f32" or "q8", or nullopt for any other name.
inline std::optional<KvFormat> kv_format_from_string(std::string_view name) {
  if (name == "f16") return KvFormat::f16;
  if (name == "f32") return KvFormat::f32;
  if (name == "q8") return KvFormat::q8;
  return std::nullopt;
}

/// How LlamaModel::load prepares a model.
struct LoadOptions {
  WeightFormat format = WeightFormat::quantized_dot;  // the fastest on the reference machine (see the benchmark)
  std::size_t max_context = 2048;                 // positions the KV cache holds
  std::size_t threads = 1;                        // threads of the model's pool; 1 runs inline
  KvFormat kv_format = KvFormat::f16;             // the KV cache's element
};

/// Where forward calls spend their time, summed over the calls made while a model profiles into it
/// (LlamaModel::set_profile): wall-clock seconds per stage, from the call's first step after checking its
/// tokens to its return. For finding what a verify pass of several positions costs beyond one of a single
/// position. A call that throws or has no tokens adds nothing. Nine clock reads a layer.
struct ForwardProfile {
  double block_products = 0;  // the transformer blocks' weight products (Q/K/V, output, gate/up, down)
  double attention = 0;       // scores, softmax and the weighted values, every layer (and quantising the
                              // output projection's inputs); in forwards of one attention task per kv head (up
                              // to attention_span() positions: 2 for SmolLM2 with AVX-512, 1 without) also RoPE
                              // and the KV cache stores
  double output_head = 0;     // the final norm and the output head's product (logits)
  double other = 0;           // buffers for the call, embedding rows, norms, SwiGLU, and for wider forwards RoPE
                              // and the KV cache stores (the norms and SwiGLU also quantise the next products'
                              // inputs)
  std::size_t forwards = 0;   // forward calls profiled
  std::size_t positions = 0;  // positions they computed

  double total() const { return block_products + attention + output_head + other; }
  ForwardProfile& operator+=(const ForwardProfile& o) {
    block_products += o.block_products, attention += o.attention, output_head += o.output_head, other += o.other;
    forwards += o.forwards, positions += o.positions;
    return *this;
  }
};

}  // namespace specdec::llama
