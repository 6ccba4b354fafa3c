// --reasoning-parser: splits a reasoning model's output into reasoning_content (the <think> part)
// and content, as vLLM's reasoning parsers do, both for a whole reply and as it streams.
//   deepseek_r1: everything up to </think> is reasoning (DeepSeek-R1's template opens <think> in
//                the prompt, so the output may lack it); no </think>: all reasoning.
//   qwen3:       reasoning only when the output opens with <think>; else all content.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace pd::server {

enum class ReasoningParser { kNone, kDeepSeekR1, kQwen3 };

// "" / "none", "deepseek_r1", "qwen3"; InvalidArgument naming the accepted values otherwise.
Result<ReasoningParser> ParseReasoningParserName(std::string_view name);

// Thread safety: not thread-safe; one request's response builder owns it.
class ReasoningSplitter {
 public:
  struct Split {
    std::string reasoning;
    std::string content;
  };

  explicit ReasoningSplitter(ReasoningParser parser);
  // The next piece of generated text; returns what can be told apart now. A tail that may be the
  // start of <think> or </think> is held back until the next Feed or Finish.
  Split Feed(std::string_view text);
  // The end of the output: flushes what was held back.
  Split Finish();

 private:
  enum class State { kStart, kReasoning, kContent };
  void Emit(std::string_view text, Split* out) const;

  State state_;
  std::string pending_;  // held back: a possible prefix of a tag
  bool opened_ = false;  // <think> was seen (or is not expected)
};

}  // namespace pd::server
