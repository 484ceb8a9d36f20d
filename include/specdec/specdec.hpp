// specdec/specdec.hpp — the umbrella header of the core: everything needed to run speculative decoding with
// your own models. It does not pull in the reference model or file parsing (see specdec/llama/llama.hpp).
//
// Layers, top down: SpeculativeDecoder (decoder.hpp) -> policies (acceptance.hpp, draft_length.hpp,
// sampling.hpp) -> the Model concept (model.hpp) -> drafts and models (drafts/, toy_models.hpp, llama/) -> Eigen.
// Entry point: SpeculativeDecoder::generate() (and generate_autoregressive(), the baseline). Read next: decoder.hpp,
// then examples/quickstart.cpp (a whole program on toy models).
#pragma once

#include "specdec/acceptance.hpp"
#include "specdec/decoder.hpp"
#include "specdec/draft_length.hpp"
#include "specdec/drafts/prompt_lookup.hpp"
#include "specdec/error.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/model.hpp"
#include "specdec/random.hpp"
#include "specdec/sampling.hpp"
#include "specdec/stats.hpp"
#include "specdec/tensor.hpp"
#include "specdec/toy_models.hpp"
