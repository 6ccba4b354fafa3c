// Test helper: an output constraint over a real model's vocabulary, for tests of constrained
// decoding on random-weight checkpoints. Every token id writes a JSON piece: "}" and "]" one id in
// 32 each (so that a random model nests and runs long before it closes), the others one of seven
// pieces; the model's end-of-sequence id writes nothing. The constraint is one JSON object.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/output_constraint.h"

namespace pd::engine::testing {

struct ObjectOverVocab {
  std::shared_ptr<TokenTexts> texts = std::make_shared<TokenTexts>();
  std::shared_ptr<JsonCallConstraint> constraint;
  int32_t eos_token_id = -1;

  ObjectOverVocab(int vocab, int32_t eos) : eos_token_id(eos) {
    static const char* const kPieces[] = {"{", "\"a\"", ":", "1", ",", " ", "["};
    for (int id = 0; id < vocab; ++id) {
      const char* piece = id % 32 == 1 ? "}" : id % 32 == 2 ? "]" : kPieces[id % 7];
      texts->bytes.push_back(id == eos ? std::string() : piece);
      texts->writes.push_back(id != eos);
    }
    constraint =
        std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{""}, std::string());
  }

  // Whether `tokens` (an output, its end-of-sequence token included) write one whole object.
  bool Whole(const std::vector<int32_t>& tokens) const {
    auto state = constraint->Start();
    for (int32_t t : tokens)
      if (t != eos_token_id) state->Advance(texts->bytes[t]);
    return state->complete();
  }
};

}  // namespace pd::engine::testing
