// specdec/detail/eigen_core.hpp — <Eigen/Core>, included without GCC 12's false uninitialised-value warnings.
//
// GCC 12 reports the placeholder operand of its own AVX-512 intrinsics (`__m512 __Y = __Y;` in
// avx512fintrin.h) as used uninitialised wherever Eigen's vectorised reductions and exp use them: built with
// -Wall -march=native on an AVX-512 machine, examples/generate.cpp got 69 such warnings and
// examples/quickstart.cpp 35. The warnings are switched off for the text of the headers included here, so they
// stay quiet wherever that text is instantiated. That works where specdec's headers are the first to include
// Eigen (or <immintrin.h>); sampling.hpp also switches them off around its own uses, for the other case.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
