#include "server/text_stream.h"

#include <algorithm>

namespace pd::server {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return lead >= 0xC2 ? 2 : 0;  // C0/C1: overlong
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return lead <= 0xF4 ? 4 : 0;
  return 0;  // a continuation byte or F8..FF
}

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

std::string Utf8Assembler::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto lead = static_cast<unsigned char>(pending_[i]);
    const int len = SequenceLength(lead);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = 1;
    while (j < static_cast<size_t>(len) && i + j < pending_.size() &&
           IsContinuation(static_cast<unsigned char>(pending_[i + j]))) {
      ++j;
    }
    if (j == static_cast<size_t>(len)) {
      out.append(pending_, i, len);
      i += len;
    } else if (i + j == pending_.size()) {
      break;  // incomplete so far: wait for the rest
    } else {
      out += kReplacement;  // broken sequence: replace its lead, resync on the next byte
      ++i;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Assembler::Flush() {
  if (pending_.empty()) return "";
  pending_.clear();
  return std::string(kReplacement);
}

std::string_view FinishReasonText(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kNone:
      return "";
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kAbort:
      return "abort";
    case engine::FinishReason::kError:
      return "error";
  }
  return "";
}

TextGenerator::TextGenerator(const model::Tokenizer& tokenizer, Options options)
    : tokenizer_(tokenizer), options_(std::move(options)) {
  for (const auto& s : options_.stop) max_stop_bytes_ = std::max(max_stop_bytes_, s.size());
}

bool TextGenerator::MatchStop(std::string* matched) {
  if (options_.stop.empty()) return false;
  // A new match must end in the new text, so it starts at most max_stop_bytes_-1 bytes earlier.
  const size_t start = searched_ >= max_stop_bytes_ ? searched_ - (max_stop_bytes_ - 1) : 0;
  size_t best = std::string::npos;
  for (const auto& s : options_.stop) {
    size_t pos = text_.find(s, start);
    if (pos < best) {
      best = pos;
      *matched = s;
    }
  }
  searched_ = text_.size();
  if (best == std::string::npos) return false;
  text_.resize(best);
  return true;
}

size_t TextGenerator::EmitLimit() const {
  if (finished_) return text_.size();
  // Hold back what could still become the start of a stop string.
  size_t hold = max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : 0;
  size_t limit = text_.size() > hold ? text_.size() - hold : 0;
  limit = std::max(limit, emitted_);
  while (limit > emitted_ && limit < text_.size() &&
         IsContinuation(static_cast<unsigned char>(text_[limit]))) {
    --limit;
  }
  return limit;
}

void TextGenerator::Emit(TextDelta* delta) {
  const size_t limit = std::min(EmitLimit(), text_.size());
  if (limit > emitted_) delta->text = text_.substr(emitted_, limit - emitted_);
  emitted_ = std::max(emitted_, limit);
  delta->finished = finished_;
}

TextDelta TextGenerator::Consume(const engine::RequestOutput& output) {
  TextDelta delta;
  if (finished_) return delta;
  for (size_t i = 0; i < output.new_token_ids.size(); ++i) {
    const int32_t id = output.new_token_ids[i];
    ++num_generated_;
    delta.token_ids.push_back(id);
    if (i < output.logprobs.size()) delta.logprobs.push_back(output.logprobs[i]);
    if (!(options_.skip_special_tokens && tokenizer_.IsSpecial(id))) {
      auto bytes = tokenizer_.TokenBytes(id);
      if (bytes.ok()) text_ += utf8_.Push(*bytes);
    }
    std::string matched;
    if (MatchStop(&matched)) {
      finished_ = true;
      delta.finish_reason = "stop";
      delta.stop_string = matched;
      delta.abort_engine = !(output.finished() && i + 1 == output.new_token_ids.size());
      Emit(&delta);
      return delta;
    }
  }
  if (output.finished()) {
    finished_ = true;
    std::string tail = utf8_.Flush();
    if (!tail.empty()) {
      text_ += tail;
      std::string matched;
      if (MatchStop(&matched)) delta.stop_string = matched;
    }
    delta.finish_reason = std::string(FinishReasonText(output.finish_reason));
    if (delta.stop_string) delta.finish_reason = "stop";
    if (output.finish_reason == engine::FinishReason::kStop && output.stop_token_id >= 0 &&
        !delta.stop_string) {
      delta.stop_token_id = output.stop_token_id;
    }
    delta.error = output.error;
  }
  Emit(&delta);
  return delta;
}

TextDelta TextGenerator::Abort() {
  TextDelta delta;
  if (finished_) return delta;
  finished_ = true;
  delta.finish_reason = "abort";
  Emit(&delta);
  return delta;
}

std::string TokenDisplay(const model::Tokenizer& tokenizer, int32_t id, bool as_token_ids) {
  if (as_token_ids) return "token_id:" + std::to_string(id);
  auto bytes = tokenizer.TokenBytes(id);
  return bytes.ok() ? *bytes : tokenizer.TokenString(id);
}

}  // namespace pd::server
