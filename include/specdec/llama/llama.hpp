// specdec/llama/llama.hpp — the umbrella header of the reference model: GGUF reader, tokenizer, llama
// transformer and early-exit draft. Entry points: LlamaModel::load(), Tokenizer::from_gguf(), EarlyExitDraft.
// The core (specdec/specdec.hpp) never includes this: a user of the decoder alone does not pull in file parsing.
// Read next: llama_model.hpp, tokenizer.hpp, then examples/generate.cpp (the command line built on them).
#pragma once

#include "specdec/llama/gguf.hpp"
#include "specdec/llama/llama_model.hpp"
#include "specdec/llama/tokenizer.hpp"
#include "specdec/llama/vocabulary_check.hpp"
