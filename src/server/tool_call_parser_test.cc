#include "server/tool_call_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/openai_response.h"
#include "server/test_fakes.h"
#include "server/tool_call_formats.h"

namespace pd::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

struct Parsed {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // (name, arguments)
  bool operator==(const Parsed&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Parsed& p) {
  os << "content=" << json(p.content).dump() << " calls=[";
  for (const auto& [n, a] : p.calls) os << n << ":" << a << " ";
  return os << "]";
}

// Feeds `pieces` in turn; checks each call's pieces (id and name first, then arguments) and that
// content never carries the start of a call marker that turned out to be one.
Parsed RunParser(ToolCallFormat format, const std::vector<std::string>& pieces,
                 const ojson& tools = nullptr) {
  ToolCallParser parser(format, tools);
  Parsed out;
  auto take = [&](ToolParse p) {
    out.content += p.content;
    for (const ToolCallDelta& d : p.calls) {
      if (!d.id.empty()) {
        EXPECT_EQ(d.index, static_cast<int>(out.calls.size()));
        EXPECT_TRUE(d.id.starts_with("call_") && d.id.size() == 29) << d.id;
        EXPECT_TRUE(d.arguments.empty());
        out.calls.push_back({d.name, ""});
      } else {
        EXPECT_EQ(d.index + 1, static_cast<int>(out.calls.size()));
        out.calls.back().second += d.arguments;
      }
    }
  };
  for (const std::string& p : pieces) take(parser.Feed(p));
  take(parser.Finish());
  EXPECT_EQ(parser.num_calls(), static_cast<int>(out.calls.size()));
  return out;
}

// Whole, and cut in two at every byte, and one byte at a time: the same result.
void ExpectParse(ToolCallFormat format, const std::string& text, const Parsed& want,
                 const ojson& tools = nullptr) {
  EXPECT_EQ(RunParser(format, {text}, tools), want) << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(RunParser(format, {text.substr(0, cut), text.substr(cut)}, tools), want)
        << text << " cut at " << cut;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  EXPECT_EQ(RunParser(format, bytes, tools), want) << text << " byte by byte";
}

TEST(ToolCallParser, Hermes) {
  const auto h = ToolCallFormat::kHermes;
  ExpectParse(h,
              "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
              "{\"city\": \"Paris\"}}\n</tool_call>",
              {"Let me check.\n", {{"get_weather", R"({"city":"Paris"})"}}});
  ExpectParse(h,
              "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
              "{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}\n</tool_call>\n",
              {"", {{"a", "{}"}, {"b", R"({"x":[1,2]})"}}});
  ExpectParse(h, "no call, 1 < 2 and <tool", {"no call, 1 < 2 and <tool", {}});
  // Not a call after all: the text stays content, markup and all.
  ExpectParse(h, "<tool_call>\n{\"name\": oops}\n</tool_call> after",
              {"<tool_call>\n{\"name\": oops}\n</tool_call> after", {}});
  ExpectParse(h, "<tool_call>{\"arguments\": {}}</tool_call>",
              {"<tool_call>{\"arguments\": {}}</tool_call>", {}});
  // Cut short (max_tokens): content.
  ExpectParse(h, "x<tool_call>\n{\"name\": \"get_weather\", \"argu",
              {"x<tool_call>\n{\"name\": \"get_weather\", \"argu", {}});
}

TEST(ToolCallParser, Qwen3CoderConvertsBySchemaType) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "search",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
    "limit": {"type": "integer"}, "exact": {"type": "boolean"}, "score": {"type": ["number", "null"]},
    "filters": {"type": "object"}, "n": {"type": "integer"}}}}}])");
  ExpectParse(ToolCallFormat::kQwen3Coder,
              "Searching.\n<tool_call>\n<function=search>\n<parameter=query>\n42 \"cats\"\n"
              "</parameter>\n<parameter=limit>\n5\n</parameter>\n<parameter=exact>\ntrue\n"
              "</parameter>\n<parameter=score>\n0.5\n</parameter>\n<parameter=filters>\n"
              "{\"lang\": \"en\"}\n</parameter>\n<parameter=n>\nmany\n</parameter>\n"
              "<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>",
              {"Searching.\n",
               {{"search", R"({"query":"42 \"cats\"","limit":5,"exact":true,"score":0.5,)"
                           R"("filters":{"lang":"en"},"n":"many","extra":"7"})"}}},
              tools);
  ExpectParse(ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=f>\n</tool_call>",
              {"<tool_call>\n<function=f>\n</tool_call>", {}});
}

TEST(ToolCallParser, DeepSeekV3) {
  const std::string call1 =
      std::string(kDeepSeekCallBegin) + "function" + std::string(kDeepSeekSep) +
      "get_weather\n```json\n{\"city\": " + "\"東京\"}\n```" + std::string(kDeepSeekCallEnd);
  const std::string call2 = std::string(kDeepSeekCallBegin) + "function" +
                            std::string(kDeepSeekSep) + "now\n```json\n{}\n```" +
                            std::string(kDeepSeekCallEnd);
  ExpectParse(ToolCallFormat::kDeepSeekV3,
              "Checking." + std::string(kDeepSeekCallsBegin) + call1 + "\n" + call2 +
                  std::string(kDeepSeekCallsEnd),
              {"Checking.", {{"get_weather", R"({"city":"東京"})"}, {"now", "{}"}}});
  // A bad block stays content.
  const std::string bad = std::string(kDeepSeekCallsBegin) + std::string(kDeepSeekCallBegin) +
                          "function" + std::string(kDeepSeekSep) + "f\n{}" +
                          std::string(kDeepSeekCallEnd);
  ExpectParse(ToolCallFormat::kDeepSeekV3, bad, {bad, {}});
}

TEST(ToolCallParser, Llama3Json) {
  const auto l = ToolCallFormat::kLlama3Json;
  ExpectParse(l, " {\"name\": \"f\", \"parameters\": {\"a\": \"}\"}}",
              {"", {{"f", R"({"a":"}"})"}}});
  ExpectParse(l,
              "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", "
              "\"arguments\": {\"b\": 2}}",
              {"", {{"f", "{}"}, {"g", R"({"b":2})"}}});
  ExpectParse(l, "Hello {\"name\": \"f\"}", {"Hello {\"name\": \"f\"}", {}});
  ExpectParse(l, "{\"name\": \"f\", \"parameters\": {",
              {"{\"name\": \"f\", \"parameters\": {", {}});
  ExpectParse(l, "{\"nom\": 1}", {"{\"nom\": 1}", {}});
}

TEST(ToolCallParser, NoneLeavesTextAlone) {
  ExpectParse(ToolCallFormat::kNone, "<tool_call>{\"name\": \"f\"}</tool_call>",
              {"<tool_call>{\"name\": \"f\"}</tool_call>", {}});
}

TEST(ToolCallParser, Names) {
  EXPECT_EQ(*ParseToolCallParserName("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(*ParseToolCallParserName("qwen3_coder"), ToolCallFormat::kQwen3Coder);
  EXPECT_EQ(*ParseToolCallParserName("deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(*ParseToolCallParserName("llama3_json"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*ParseToolCallParserName(""), ToolCallFormat::kNone);
  auto bad = ParseToolCallParserName("mistral");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("'mistral' is not one of hermes"));
}

// What the forced-call constraint accepts is what the parser reads as that call.
TEST(ToolCallParser, ForcedCallTextParsesAsTheCall) {
  auto texts = std::make_shared<engine::TokenTexts>();
  const std::string args = R"({"city": "Paris", "days": [1, 2.5e1], "ok": true})";
  for (auto format :
       {ToolCallFormat::kHermes, ToolCallFormat::kDeepSeekV3, ToolCallFormat::kLlama3Json}) {
    auto constraint = ForcedCallConstraint(format, {"get_time", "get_weather"}, texts);
    ASSERT_TRUE(constraint.ok()) << constraint.status().ToString();
    auto state = (*constraint)->Start();
    std::string text;
    if (format == ToolCallFormat::kHermes) {
      text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>";
    } else if (format == ToolCallFormat::kDeepSeekV3) {
      text = std::string(kDeepSeekCallsBegin) + std::string(kDeepSeekCallBegin) + "function" +
             std::string(kDeepSeekSep) + "get_weather\n```json\n" + args + "\n```" +
             std::string(kDeepSeekCallEnd) + std::string(kDeepSeekCallsEnd);
    } else {
      text = "{\"name\": \"get_weather\", \"parameters\": " + args + "}";
    }
    for (size_t n = 1; n <= text.size(); ++n) ASSERT_TRUE(state->Allows(text.substr(0, n))) << n;
    state->Advance(text);
    EXPECT_TRUE(state->complete()) << text;
    EXPECT_EQ(RunParser(format, {text}),
              (Parsed{"", {{"get_weather", R"({"city":"Paris","days":[1,25.0],"ok":true})"}}}))
        << text;
    // Another name than the tools', or arguments that are not an object, are refused.
    auto fresh = (*constraint)->Start();
    const std::string wrong = text.substr(0, text.find("get_weather")) + "get_wx";
    EXPECT_FALSE(fresh->Allows(wrong)) << wrong;
  }
  auto coder =
      ForcedCallConstraint(ToolCallFormat::kQwen3Coder, {"get_time", "get_weather"}, texts);
  ASSERT_TRUE(coder.ok());
  const std::string xml =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nSt. <Paris>\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  auto state = (*coder)->Start();
  for (size_t n = 1; n <= xml.size(); ++n) ASSERT_TRUE(state->Allows(xml.substr(0, n))) << n;
  EXPECT_EQ(state->CompletionBytesAfter(""), std::string("<tool_call>\n<function=get_time>\n"
                                                         "</function>\n</tool_call>")
                                                 .size());
  state->Advance(xml);
  EXPECT_TRUE(state->complete());
  EXPECT_EQ(RunParser(ToolCallFormat::kQwen3Coder, {xml}),
            (Parsed{"", {{"get_weather", R"({"city":"St. <Paris>","days":"3"})"}}}));
  auto fresh = (*coder)->Start();
  EXPECT_FALSE(fresh->Allows("<tool_call>\n<function=get_wx"));
  EXPECT_FALSE(fresh->Allows("<tool_call>\n<function=get_time>\n<parameter=a b"));
  EXPECT_FALSE(fresh->Allows("<tool_call>\n<function=get_time>\n<parameter=a>\nx</tool_call>"));
  EXPECT_TRUE(fresh->Allows("<tool_call>\n<function=get_time>\n<parameter=a>\nx</tool_"));
  auto none = ForcedCallConstraint(ToolCallFormat::kNone, {"f"}, texts);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), ::testing::HasSubstr("--tool-call-parser"));
}

TextDelta Delta(std::string text, bool finished = false, std::string reason = "stop") {
  TextDelta d;
  d.text = std::move(text);
  d.finished = finished;
  if (finished) d.finish_reason = std::move(reason);
  return d;
}

ResponseFormat ToolFormat(ReasoningParser reasoning = ReasoningParser::kNone) {
  ResponseFormat f;
  f.kind = ApiKind::kChat;
  f.id = "chatcmpl-1";
  f.model = "m";
  f.reasoning_parser = reasoning;
  f.tool_call_format = ToolCallFormat::kHermes;
  f.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  return f;
}

TEST(ToolCallResponse, WholeReplyHasToolCallsAndFinishReason) {
  testing::FakeTokenizer tokenizer;
  ResponseBuilder b(ToolFormat(ReasoningParser::kQwen3), tokenizer);
  b.Accumulate(Delta("<think>rain?</think>Checking.<tool_call>\n{\"name\": \"get_weather\", "));
  b.Accumulate(Delta("\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", true));
  const json choice = json::parse(b.Final(3, 9))["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"], "rain?");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>())["city"], "Oslo");

  // Cut short by max_tokens: finish_reason "length", the partial text as content, no tool_calls.
  ResponseBuilder cut(ToolFormat(), tokenizer);
  cut.Accumulate(Delta("<tool_call>\n{\"name\": \"get_weather\", \"argu", true, "length"));
  const json cut_choice = json::parse(cut.Final(3, 9))["choices"][0];
  EXPECT_EQ(cut_choice["finish_reason"], "length");
  EXPECT_EQ(cut_choice["message"]["content"], "<tool_call>\n{\"name\": \"get_weather\", \"argu");
  EXPECT_FALSE(cut_choice["message"].contains("tool_calls"));
}

TEST(ToolCallResponse, StreamSendsNameFirstThenArgumentsAndNoMarkup) {
  testing::FakeTokenizer tokenizer;
  ResponseBuilder b(ToolFormat(), tokenizer);
  std::vector<json> chunks;
  for (const TextDelta& d :
       {Delta("Sure.<tool"), Delta("_call>\n{\"name\": \"get_weather\", \"arguments\": {}}"),
        Delta("\n</tool_call>"), Delta("", true)}) {
    std::string events = b.Chunk(d);
    while (!events.empty()) {
      ASSERT_TRUE(events.starts_with("data: ")) << events;
      const size_t end = events.find("\n\n");
      chunks.push_back(json::parse(events.substr(6, end - 6))["choices"][0]);
      events.erase(0, end + 2);
    }
  }
  std::string content;
  std::vector<json> calls;
  for (const json& c : chunks) {
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls")) calls.push_back(c["delta"]["tool_calls"][0]);
  }
  EXPECT_EQ(content, "Sure.");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_TRUE(calls[0].contains("id"));
  EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
  EXPECT_FALSE(calls[1].contains("id"));
  EXPECT_EQ(chunks.back()["finish_reason"], "tool_calls");
  for (size_t i = 0; i + 1 < chunks.size(); ++i) EXPECT_TRUE(chunks[i]["finish_reason"].is_null());
}

}  // namespace
}  // namespace pd::server
