// specdec/llama/vocabulary_check.hpp — checking that a draft model speaks the target's vocabulary.
// Entry point: check_same_vocabulary(). Read next: llama_model.hpp.
#pragma once

#include <string>

#include "specdec/error.hpp"
#include "specdec/llama/tokenizer.hpp"

namespace specdec::llama {

/// Throws specdec::Error unless both tokenizers have the same size and the same token texts, naming the
/// first difference: "draft vocabulary has 32000 tokens, target has 49152" or
/// "draft token 17 is 'ab', target token 17 is 'cd'".
inline void check_same_vocabulary(const Tokenizer& draft, const Tokenizer& target) {
  if (draft.size() != target.size())
    specdec::detail::fail("draft vocabulary has ", draft.size(), " tokens, target has ", target.size());
  for (std::size_t i = 0; i < draft.size(); ++i)
    if (draft.tokens()[i] != target.tokens()[i])
      specdec::detail::fail("draft token ", i, " is '", draft.tokens()[i], "', target token ", i, " is '", target.tokens()[i], "'");
}

}  // namespace specdec::llama
