// specdec/detail/eigen_core.hpp — <Eigen/Core>, included without GCC 12's false uninitialised-value warnings
// (see quiet_warnings.hpp): they are switched off for the text of the headers included here, so they stay
// quiet wherever that text is instantiated. That works where specdec's headers are the first to include Eigen
// (or <immintrin.h>); sampling.hpp also switches them off around its own uses of Eigen, for the other case.
#pragma once

#include "specdec/detail/quiet_warnings.hpp"

SPECDEC_AVX512_WARNINGS_OFF
#include <Eigen/Core>
SPECDEC_AVX512_WARNINGS_ON
