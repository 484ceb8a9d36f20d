// specdec/llama/vocabulary_check.hpp — checking that a draft model speaks the target's vocabulary.
// Entry point: check_same_vocabulary(). Read next: llama_model.hpp.
#pragma once

#include <algorithm>
#include <string>

#include "specdec/error.hpp"
#include "specdec/llama/tokenizer.hpp"

namespace specdec::llama {

/// Throws specdec::Error unless both tokenizers have the same size and the same token texts, naming the
/// first difference: "draft token 17 is 'ab', target token 17 is 'cd'", or where one vocabulary is the other
/// and more, "draft vocabulary has 49155 tokens, target has 49152: the first extra is draft token 49152, 'xy'".
inline void check_same_vocabulary(const Tokenizer& draft, const Tokenizer& target) {
  const std::size_t common = std::min(draft.size(), target.size());
  for (std::size_t i = 0; i < common; ++i)
    if (draft.tokens()[i] != target.tokens()[i])
      specdec::detail::fail("draft token ", i, " is '", draft.tokens()[i], "', target token ", i, " is '", target.tokens()[i], "'");
  if (draft.size() != target.size()) {
    const bool draft_longer = draft.size() > target.size();
    specdec::detail::fail("draft vocabulary has ", draft.size(), " tokens, target has ", target.size(),
                          ": the first extra is ", draft_longer ? "draft" : "target", " token ", common, ", '",
                          (draft_longer ? draft : target).tokens()[common], "'");
  }
}

}  // namespace specdec::llama
