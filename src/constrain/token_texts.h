// The bytes each token of a tokenizer writes (engine::TokenTexts), for constraints over text.
#pragma once

#include <memory>

#include "engine/output_constraint.h"
#include "model/tokenizer.h"

namespace pd::constrain {

// Special tokens, and ids the tokenizer cannot decode, write nothing.
std::shared_ptr<const engine::TokenTexts> TokenTextsOf(const model::Tokenizer& tokenizer);

}  // namespace pd::constrain
