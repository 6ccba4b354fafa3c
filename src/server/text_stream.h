// Engine tokens to OpenAI text: incremental UTF-8-safe detokenisation, stop strings and exact
// token counting. Pure logic on the HTTP thread; no engine, no HTTP.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "model/tokenizer.h"

namespace pd::server {

// Bytes in, complete UTF-8 characters out: an incomplete multi-byte sequence at the end is held
// back until its continuation bytes arrive; bytes that can never form a character become U+FFFD.
class Utf8Assembler {
 public:
  std::string Push(std::string_view bytes);
  // Whatever is held back, as one U+FFFD (or "" when nothing is).
  std::string Flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string pending_;
};

// "stop" | "length" | "abort" | "error" | "" for kNone.
std::string_view FinishReasonText(engine::FinishReason reason);

// One step of news for the client.
struct TextDelta {
  std::string text;                            // new text (never half a character)
  std::vector<int32_t> token_ids;              // tokens consumed by this delta
  std::vector<engine::TokenLogprob> logprobs;  // one per token when logprobs were asked for
  bool finished = false;
  std::string finish_reason;               // set when finished
  std::optional<std::string> stop_string;  // the stop string that ended the request
  std::optional<int32_t> stop_token_id;    // the stop token that ended it
  bool abort_engine = false;               // a stop string matched before the engine finished
  Status error;                            // finish_reason == "error"
  bool empty() const { return text.empty() && token_ids.empty() && !finished; }
};

// Thread safety: not thread-safe; one HTTP thread owns it.
class TextGenerator {
 public:
  struct Options {
    std::vector<std::string> stop;
    bool skip_special_tokens = true;
  };
  TextGenerator(const model::Tokenizer& tokenizer, Options options);

  // Consumes one engine output. After finished() further outputs are ignored (empty delta):
  // tokens generated after a stop string are not counted.
  TextDelta Consume(const engine::RequestOutput& output);
  // Finishes the request from the server side (client gone): reason "abort".
  TextDelta Abort();

  bool finished() const { return finished_; }
  int num_generated_tokens() const { return num_generated_; }
  const std::string& text() const { return text_; }  // all text so far (trimmed at a stop string)

 private:
  bool MatchStop(std::string* matched);
  size_t EmitLimit() const;
  void Emit(TextDelta* delta);

  const model::Tokenizer& tokenizer_;
  const Options options_;
  size_t max_stop_bytes_ = 0;
  Utf8Assembler utf8_;
  std::string text_;
  size_t emitted_ = 0;   // bytes of text_ sent
  size_t searched_ = 0;  // bytes of text_ already searched for stop strings
  int num_generated_ = 0;
  bool finished_ = false;
};

// How a token reads in logprob output: "token_id:N" when as_token_ids, else its bytes.
std::string TokenDisplay(const model::Tokenizer& tokenizer, int32_t id, bool as_token_ids);

}  // namespace pd::server
