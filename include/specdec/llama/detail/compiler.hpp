// specdec/llama/detail/compiler.hpp — compiler hints shared by the kernels (matmul*.hpp, attention*.hpp).
#pragma once

#include "specdec/detail/quiet_warnings.hpp"  // SPECDEC_AVX512_WARNINGS_OFF / _ON, SPECDEC_SIGN_WARNINGS_OFF / _ON

#if defined(__GNUC__)
#define SPECDEC_ALWAYS_INLINE inline __attribute__((always_inline))
#define SPECDEC_ALWAYS_INLINE_LAMBDA __attribute__((always_inline))
// Keeps a loaded vector in a register: GCC otherwise folds the load into every instruction that uses it as a
// memory operand, which costs one load per use instead of one.
#define SPECDEC_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define SPECDEC_ALWAYS_INLINE inline
#define SPECDEC_ALWAYS_INLINE_LAMBDA
#define SPECDEC_IN_REGISTER(v) (void)0
#endif

// Unrolls the loop that follows completely. The kernels keep their accumulators and weight vectors in arrays
// indexed by loop counters with compile-time bounds; GCC's -O3 unrolls such loops and keeps the arrays in
// registers, but -O2 (CMake's RelWithDebInfo) does not, and leaves them in memory: forwards of SmolLM2 built
// with -O2 took 2x the time in f32 and 1.1x in bf16_dot and quantized without this.
#if defined(__GNUC__)
#define SPECDEC_UNROLL _Pragma("GCC unroll 16")
#else
#define SPECDEC_UNROLL
#endif
