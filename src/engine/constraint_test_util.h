// Test helper: an output constraint over a real model's vocabulary, for tests of constrained
// decoding on random-weight checkpoints. Every token id writes a JSON piece: "}" and "]" one id in
// 32 each (so that a random model nests and runs long before it closes), the others one of seven
// pieces; the model's end-of-sequence id writes nothing. The constraint is one JSON object.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/output_constraint.h"
#include "engine/request.h"

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

  // Constrains each request to one object, ending at end-of-sequence within 24 tokens; the odd
  // ones sampled (temperature 0.8, seeded), the even ones greedy.
  void Constrain(std::vector<Request>* requests) const {
    for (size_t i = 0; i < requests->size(); ++i) {
      SamplingParams& p = (*requests)[i].sampling;
      p.constraint = constraint;
      p.ignore_eos = false;
      p.max_tokens = 24;
      if (i % 2 == 1) {
        p.temperature = 0.8f;
        p.seed = 5 + i;
      }
    }
  }

  // Expects the greedy requests' outputs (by request id, as Constrain numbered them) to equal
  // `want`'s token for token, and every output of both to be one whole object.
  void ExpectOutputs(const std::map<int64_t, std::vector<int32_t>>& got,
                     const std::map<int64_t, std::vector<int32_t>>& want) const {
    EXPECT_EQ(got.size(), want.size());
    for (const auto& [id, tokens] : got) {
      if (id % 2 == 0 && want.count(id) != 0) {
        EXPECT_EQ(tokens, want.at(id)) << "request " << id;
      }
      EXPECT_TRUE(Whole(tokens)) << "request " << id << " is not one object";
    }
    for (const auto& [id, tokens] : want)
      EXPECT_TRUE(Whole(tokens)) << "request " << id << " without speculation";
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
