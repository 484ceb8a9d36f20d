// specdec/llama/detail/matmul_dispatch.hpp — detail::matmul_panels, which picks the kernel for a matrix's
// encoding: AVX-512 or AVX2 where the build has them, else the portable twin (the same bits, bf16_dot's
// vdpbf16ps excepted; see matmul_kernels.hpp).
// Entry point: detail::matmul_panels. Read first: ../matmul.hpp. Read next: matmul_kernels.hpp and
// matmul_dot_kernels.hpp (the portable kernels and what every path shares), then the kernels of each ISA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "specdec/llama/detail/matmul_avx2.hpp"
#include "specdec/llama/detail/matmul_avx512.hpp"
#include "specdec/llama/detail/matmul_dot_avx2.hpp"
#include "specdec/llama/detail/matmul_dot_avx512.hpp"
#include "specdec/llama/detail/matmul_dot_kernels.hpp"
#include "specdec/llama/detail/matmul_kernels.hpp"

namespace specdec::llama::detail {

/// Output panels [first, last) of `out` for all positions.
inline void matmul_panels(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                          std::size_t x_stride, std::size_t positions, bool portable, std::uint64_t call,
                          QuantizedInputs given) {
#if defined(__AVX512F__)
  if (!portable) {
    switch (out.weights->encoding()) {
      case PanelEncoding::f32:
        return matmul_panels_avx512<VisitF32, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::bf16:
        return matmul_panels_avx512<VisitBf16, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
#if defined(__AVX512BF16__)
      case PanelEncoding::bf16_dot:
        return matmul_panels_avx512<DotBf16, InputLayout::bf16_pairs>(out, first, last, x, x_stride, positions, call);
#else
      case PanelEncoding::bf16_dot:  // no BF16 dot instruction: bf16 products of bf16-rounded inputs, as portable
        return matmul_panels_avx512<VisitBf16, InputLayout::bf16_rounded>(out, first, last, x, x_stride, positions,
                                                                           call);
#endif
      default: break;
    }
#if defined(__AVX512VNNI__)
    const auto run = [&](auto type, auto digits) {
      matmul_panels_dot_avx512<type(), digits()>(out, first, last, x, x_stride, positions, call, given);
    };
    if (with_block_encoding(out.weights->encoding(), run)) return;
#endif
  }
#endif
#if defined(SPECDEC_HAVE_AVX2_FLOAT)
  if (!portable) {
    switch (out.weights->encoding()) {
      case PanelEncoding::f32:
        return matmul_panels_avx2<VisitF32Avx2, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::bf16:
        return matmul_panels_avx2<VisitBf16Avx2, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::bf16_dot:
        return matmul_panels_avx2<VisitBf16Avx2, InputLayout::bf16_rounded>(out, first, last, x, x_stride, positions,
                                                                            call);
      default: break;
    }
  }
#endif
#if defined(SPECDEC_HAVE_AVX2_DOT)
  const auto run = [&](auto type, auto digits) {
    matmul_panels_dot_avx2<type(), digits()>(out, first, last, x, x_stride, positions, call, given);
  };
  if (!portable && with_block_encoding(out.weights->encoding(), run)) return;
#endif
  (void)portable;
  if (!is_float_encoding(out.weights->encoding()))
    return matmul_panels_dot_portable(out, first, last, x, x_stride, positions, call, given);
  matmul_panels_portable(out, first, last, x, x_stride, positions);
}

}  // namespace specdec::llama::detail
