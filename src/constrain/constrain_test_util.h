// Test helpers: automata over a vocabulary of the 256 single bytes, so a text walks byte by byte.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "constrain/json_schema.h"
#include "constrain/token_automaton.h"

namespace pd::constrain::testing {

inline std::shared_ptr<const engine::TokenTexts> TextsOf(const std::vector<std::string>& vocab) {
  auto t = std::make_shared<engine::TokenTexts>();
  for (const std::string& v : vocab) {
    t->bytes.push_back(v);
    t->writes.push_back(true);
  }
  return t;
}

inline std::shared_ptr<const engine::TokenTexts> ByteTexts() {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  return TextsOf(vocab);
}

inline std::shared_ptr<const TokenAutomaton> AutomatonOf(const RegexNode& node) {
  static auto texts = ByteTexts();
  static auto trie = std::make_shared<VocabTrie>(*texts);
  auto a = TokenAutomaton::Create(node, texts, trie);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : nullptr;
}

// The whole text is a sentence of the language.
inline bool FullMatch(const TokenAutomaton& a, std::string_view text) {
  const int32_t s = a.Walk(a.start_state(), text);
  return s != TokenAutomaton::kDead && a.Info(s).accepting;
}

// A matcher of regex text: FullMatch after parsing (which must succeed).
class Re {
 public:
  explicit Re(std::string_view pattern) {
    auto node = ParseRegex(pattern);
    EXPECT_TRUE(node.ok()) << pattern << ": " << node.status().ToString();
    if (node.ok()) automaton_ = AutomatonOf(*node);
  }
  bool Matches(std::string_view text) const {
    return automaton_ != nullptr && FullMatch(*automaton_, text);
  }
  const TokenAutomaton& automaton() const { return *automaton_; }

 private:
  std::shared_ptr<const TokenAutomaton> automaton_;
};

}  // namespace pd::constrain::testing
