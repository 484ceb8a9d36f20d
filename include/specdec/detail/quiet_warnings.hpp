// specdec/detail/quiet_warnings.hpp — SPECDEC_AVX512_WARNINGS_OFF / _ON and SPECDEC_SIGN_WARNINGS_OFF / _ON
// around code that GCC 12 misreports.
//
// GCC 12 reports the placeholder operand of its own AVX-512 intrinsics (`__m512 __Y = __Y;` from
// _mm512_undefined_ps and the like, in avx512fintrin.h) as used uninitialised wherever code that uses those
// intrinsics is inlined: Eigen's vectorised reductions and exp, and specdec's kernels. Built with -Wall
// -march=native on an AVX-512 machine, examples/generate.cpp got 69 such warnings and examples/quickstart.cpp
// 35. The pair switches -Wuninitialized and -Wmaybe-uninitialized off for the source text between them.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#define SPECDEC_AVX512_WARNINGS_OFF                                   \
  _Pragma("GCC diagnostic push")                                      \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")               \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define SPECDEC_AVX512_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define SPECDEC_AVX512_WARNINGS_OFF
#define SPECDEC_AVX512_WARNINGS_ON
#endif

// Under -Wsign-conversion GCC 12 reports two things that are no mistake:
// - an array whose bound is an int template parameter, such as the kernels' register tiles (`__m512 acc[R][P]`),
//   though the bound is a positive constant;
// - unoptimised, some AVX-512 intrinsics are macros (in avx512fintrin.h) that pass the mask (__mmask16)(-1) to a
//   builtin taking a short (the same bits), reported at the line that calls them.
// Clang reports neither. The pair switches -Wsign-conversion off under GCC for the source text between them (the
// six vector-kernel files, where today it finds only the tile bounds, and one call); clang still checks that text
// (the "headers: strict warnings" test builds with both where clang is installed).
#if defined(__GNUC__) && !defined(__clang__)
#define SPECDEC_SIGN_WARNINGS_OFF \
  _Pragma("GCC diagnostic push")  \
  _Pragma("GCC diagnostic ignored \"-Wsign-conversion\"")
#define SPECDEC_SIGN_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define SPECDEC_SIGN_WARNINGS_OFF
#define SPECDEC_SIGN_WARNINGS_ON
#endif
