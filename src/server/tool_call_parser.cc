#include "server/tool_call_parser.h"

#include <random>

#include "server/tool_call_formats.h"
#include "server/xml_call_constraint.h"

namespace pd::server {
namespace {

using ojson = nlohmann::ordered_json;

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

struct Markers {
  std::string_view start;        // opens the tool-call part
  std::string_view call_begin;   // opens one call (== start when there is no section)
  std::string_view call_end;     // closes one call
  std::string_view section_end;  // closes the section ("" when calls stand alone)
};

Markers MarkersOf(ToolCallFormat format) {
  if (format == ToolCallFormat::kDeepSeekV3) {
    return {kDeepSeekCallsBegin, kDeepSeekCallBegin, kDeepSeekCallEnd, kDeepSeekCallsEnd};
  }
  return {kHermesCallBegin, kHermesCallBegin, kHermesCallEnd, ""};
}

}  // namespace

Result<ToolCallFormat> ParseToolCallParserName(std::string_view name) {
  if (name.empty() || name == "none") return ToolCallFormat::kNone;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "qwen3_coder") return ToolCallFormat::kQwen3Coder;
  if (name == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  return InvalidArgument("--tool-call-parser '" + std::string(name) +
                         "' is not one of hermes, qwen3_coder, deepseek_v3, llama3_json, none");
}

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
  return id;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, ojson tools)
    : format_(format),
      tools_(std::move(tools)),
      state_(format == ToolCallFormat::kNone ? State::kPlain : State::kText) {}

ToolParse ToolCallParser::Feed(std::string_view text) {
  ToolParse out;
  std::string buf = std::move(pending_) + std::string(text);
  pending_.clear();
  while (!buf.empty()) {
    switch (state_) {
      case State::kText:
        FeedText(&buf, &out);
        break;
      case State::kCall:
        FeedCall(&buf, &out);
        break;
      case State::kSection:
        FeedSection(&buf, &out);
        break;
      case State::kWhole:
        pending_ += buf;
        buf.clear();
        break;
      case State::kPlain:
        out.content += buf;
        buf.clear();
        break;
    }
  }
  return out;
}

void ToolCallParser::FeedText(std::string* buf, ToolParse* out) {
  if (skip_space_) {
    size_t n = 0;
    while (n < buf->size() && IsSpace((*buf)[n])) ++n;
    buf->erase(0, n);
    if (buf->empty()) return;
    skip_space_ = false;
  }
  if (format_ == ToolCallFormat::kLlama3Json) {  // a call only when the reply starts with one
    size_t n = 0;
    while (n < buf->size() && IsSpace((*buf)[n])) ++n;
    const std::string_view rest = std::string_view(*buf).substr(n);
    if (rest.empty() ||
        (rest.size() < kLlamaPythonTag.size() && kLlamaPythonTag.starts_with(rest))) {
      pending_ = std::move(*buf);  // undecided yet
    } else if (rest.starts_with("{") || rest.starts_with(kLlamaPythonTag)) {
      state_ = State::kWhole;
      pending_ = std::move(*buf);
    } else {
      state_ = State::kPlain;
      out->content += *buf;
    }
    buf->clear();
    return;
  }
  const Markers m = MarkersOf(format_);
  const size_t pos = buf->find(m.start);
  if (pos == std::string::npos) {
    const size_t hold = PartialTagSuffix(*buf, m.start);
    out->content.append(*buf, 0, buf->size() - hold);
    pending_ = buf->substr(buf->size() - hold);
    buf->clear();
    return;
  }
  out->content.append(*buf, 0, pos);
  buf->erase(0, pos + m.start.size());
  raw_ = std::string(m.start);
  body_start_ = raw_.size();
  state_ = m.section_end.empty() ? State::kCall : State::kSection;
}

void ToolCallParser::FeedCall(std::string* buf, ToolParse* out) {
  const Markers m = MarkersOf(format_);
  const size_t old_size = raw_.size();
  raw_ += *buf;
  buf->clear();
  // A new end marker ends in the new text.
  const size_t from = std::max(
      body_start_, old_size >= m.call_end.size() ? old_size - m.call_end.size() + 1 : size_t{0});
  const size_t end = raw_.find(m.call_end, from);
  if (end == std::string::npos) return;  // the call goes on
  const size_t body_start = body_start_;
  *buf = raw_.substr(end + m.call_end.size());
  raw_.resize(end + m.call_end.size());
  if (EmitCall(std::string_view(raw_).substr(body_start, end - body_start), out)) {
    skip_space_ = true;
    state_ = m.section_end.empty() ? State::kText : State::kSection;
  } else {
    out->content += raw_;  // not a call after all: the text stays as it was written
    state_ = State::kText;
  }
  raw_.clear();
}

// DeepSeek-V3, between calls: whitespace, then the next call or the end of the section.
void ToolCallParser::FeedSection(std::string* buf, ToolParse* out) {
  const Markers m = MarkersOf(format_);
  size_t n = 0;
  while (n < buf->size() && IsSpace((*buf)[n])) ++n;
  const std::string_view rest = std::string_view(*buf).substr(n);
  if (rest.empty()) {
    pending_ = std::move(*buf);
  } else if (rest.starts_with(m.call_begin)) {
    raw_ += buf->substr(0, n + m.call_begin.size());
    buf->erase(0, n + m.call_begin.size());
    body_start_ = raw_.size();
    state_ = State::kCall;
    return;
  } else if (rest.starts_with(m.section_end)) {
    buf->erase(0, n + m.section_end.size());
    raw_.clear();
    skip_space_ = true;
    state_ = State::kText;
    return;
  } else if (m.call_begin.starts_with(rest) || m.section_end.starts_with(rest)) {
    pending_ = std::move(*buf);
  } else {  // neither a call nor the end: the section was not one
    out->content += raw_;
    raw_.clear();
    state_ = State::kText;
    return;
  }
  buf->clear();
}

ToolParse ToolCallParser::Finish() {
  ToolParse out;
  switch (state_) {
    case State::kText:
      if (!skip_space_) out.content = std::move(pending_);
      break;
    case State::kCall:  // cut short: what was written stays content
      out.content = raw_;
      break;
    case State::kSection:
      out.content = raw_;
      if (!raw_.empty() || num_calls_ == 0) out.content += pending_;
      break;
    case State::kWhole:
      EmitCalls(pending_, &out);
      break;
    case State::kPlain:
      break;
  }
  pending_.clear();
  raw_.clear();
  state_ = State::kPlain;
  return out;
}

bool ToolCallParser::EmitCall(std::string_view body, ToolParse* out) {
  Result<ParsedCall> call = InvalidArgument("no format");
  if (format_ == ToolCallFormat::kHermes) call = ParseHermesCall(body);
  if (format_ == ToolCallFormat::kQwen3Coder) call = ParseQwen3CoderCall(body, tools_);
  if (format_ == ToolCallFormat::kDeepSeekV3) call = ParseDeepSeekCall(body);
  if (!call.ok()) return false;
  out->calls.push_back({num_calls_, NewToolCallId(), call->name, ""});
  out->calls.push_back({num_calls_, "", "", call->arguments});
  ++num_calls_;
  return true;
}

void ToolCallParser::EmitCalls(std::string_view whole, ToolParse* out) {
  Result<std::vector<ParsedCall>> calls = ParseLlama3Calls(whole);
  if (!calls.ok()) {
    out->content += whole;
    return;
  }
  for (ParsedCall& c : *calls) {
    out->calls.push_back({num_calls_, NewToolCallId(), c.name, ""});
    out->calls.push_back({num_calls_, "", "", std::move(c.arguments)});
    ++num_calls_;
  }
}

Result<std::shared_ptr<const engine::OutputConstraint>> ForcedCallConstraint(
    ToolCallFormat format, const std::vector<std::string>& names,
    std::shared_ptr<const engine::TokenTexts> texts) {
  std::vector<std::string> prefixes;
  std::string suffix;
  for (const std::string& name : names) {
    const std::string quoted = nlohmann::json(name).dump();
    switch (format) {
      case ToolCallFormat::kHermes:
        prefixes.push_back(std::string(kHermesCallBegin) + "\n{\"name\": " + quoted +
                           ", \"arguments\": ");
        suffix = "}\n" + std::string(kHermesCallEnd);
        break;
      case ToolCallFormat::kDeepSeekV3:
        prefixes.push_back(std::string(kDeepSeekCallsBegin) + std::string(kDeepSeekCallBegin) +
                           "function" + std::string(kDeepSeekSep) + name + "\n```json\n");
        suffix = "\n```" + std::string(kDeepSeekCallEnd) + std::string(kDeepSeekCallsEnd);
        break;
      case ToolCallFormat::kLlama3Json:
        prefixes.push_back("{\"name\": " + quoted + ", \"parameters\": ");
        suffix = "}";
        break;
      case ToolCallFormat::kQwen3Coder:
        return std::shared_ptr<const engine::OutputConstraint>(
            std::make_shared<XmlCallConstraint>(std::move(texts), names));
      case ToolCallFormat::kNone:
        return InvalidArgument(
            "forcing a tool call ('tool_choice' \"required\" or a named function) needs the "
            "server started with --tool-call-parser");
    }
  }
  return std::shared_ptr<const engine::OutputConstraint>(
      std::make_shared<engine::JsonCallConstraint>(std::move(texts), std::move(prefixes),
                                                   std::move(suffix)));
}

}  // namespace pd::server
