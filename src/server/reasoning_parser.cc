#include "server/reasoning_parser.h"

namespace pd::server {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

Result<ReasoningParser> ParseReasoningParserName(std::string_view name) {
  if (name.empty() || name == "none") return ReasoningParser::kNone;
  if (name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  if (name == "qwen3") return ReasoningParser::kQwen3;
  return InvalidArgument("--reasoning-parser '" + std::string(name) +
                         "' is not one of deepseek_r1, qwen3, none");
}

ReasoningSplitter::ReasoningSplitter(ReasoningParser parser)
    : state_(parser == ReasoningParser::kNone ? State::kContent : State::kStart),
      opened_(parser == ReasoningParser::kNone) {
  // DeepSeek-R1 reasons from the first token whether or not it writes <think> itself.
  if (parser == ReasoningParser::kDeepSeekR1) state_ = State::kReasoning;
}

void ReasoningSplitter::Emit(std::string_view text, Split* out) const {
  (state_ == State::kReasoning ? out->reasoning : out->content).append(text);
}

ReasoningSplitter::Split ReasoningSplitter::Feed(std::string_view text) {
  Split out;
  std::string buf = pending_ + std::string(text);
  pending_.clear();
  while (!buf.empty()) {
    if (!opened_) {  // at the very start: <think>, or (qwen3) no reasoning at all
      if (buf.size() < kOpen.size() && kOpen.substr(0, buf.size()) == buf) {
        pending_ = std::move(buf);
        return out;
      }
      opened_ = true;
      if (buf.starts_with(kOpen)) {
        buf.erase(0, kOpen.size());
        state_ = State::kReasoning;
      } else if (state_ == State::kStart) {
        state_ = State::kContent;
      }
      continue;
    }
    if (state_ != State::kReasoning) {
      Emit(buf, &out);
      return out;
    }
    const size_t close = buf.find(kClose);
    if (close != std::string::npos) {
      Emit(std::string_view(buf).substr(0, close), &out);
      buf.erase(0, close + kClose.size());
      state_ = State::kContent;
      continue;
    }
    const size_t hold = PartialTagSuffix(buf, kClose);
    Emit(std::string_view(buf).substr(0, buf.size() - hold), &out);
    pending_ = buf.substr(buf.size() - hold);
    return out;
  }
  return out;
}

ReasoningSplitter::Split ReasoningSplitter::Finish() {
  Split out;
  if (!opened_ && state_ == State::kStart) state_ = State::kContent;  // qwen3: a bare "<thi"
  Emit(pending_, &out);
  pending_.clear();
  return out;
}

}  // namespace pd::server
