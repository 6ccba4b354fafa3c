#include "server/openai_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pd::server {
namespace {

using ::testing::HasSubstr;

ProtocolLimits Limits() {
  ProtocolLimits l;
  l.served_model_name = "tiny";
  l.max_model_len = 64;
  l.vocab_size = 100;
  return l;
}

Result<GenerateRequest> Completion(std::string_view body) {
  return ParseGenerateRequest(ApiKind::kCompletion, body, Limits());
}
Result<GenerateRequest> Chat(std::string_view body) {
  return ParseGenerateRequest(ApiKind::kChat, body, Limits());
}

void ExpectError(const Result<GenerateRequest>& r, StatusCode code, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(needle));
}

TEST(OpenAiProtocolTest, ParsesAllCompletionFields) {
  auto r = Completion(R"({"model":"tiny","prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,
    "top_k":7,"seed":42,"stop":["a","bc"],"logprobs":3,"stream":true,
    "stream_options":{"include_usage":true},"ignore_eos":true,"return_tokens_as_token_ids":true})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r->prompt_text, "hi");
  EXPECT_EQ(*r->max_tokens, 5);
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.top_p, 0.9f);
  EXPECT_EQ(r->sampling.top_k, 7);
  EXPECT_EQ(*r->sampling.seed, 42u);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r->num_logprobs, 3);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->sampling.ignore_eos);
  EXPECT_TRUE(r->return_tokens_as_token_ids);
}

TEST(OpenAiProtocolTest, PromptForms) {
  auto list1 = Completion(R"({"prompt":["one"]})");
  ASSERT_TRUE(list1.ok());
  EXPECT_EQ(*list1->prompt_text, "one");
  auto ids = Completion(R"({"prompt":[1,2,99]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->prompt_ids, (std::vector<int32_t>{1, 2, 99}));
  auto nested = Completion(R"({"prompt":[[3,4]]})");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->prompt_ids, (std::vector<int32_t>{3, 4}));
  auto stop = Completion(R"({"prompt":"x","stop":"end"})");
  ASSERT_TRUE(stop.ok());
  EXPECT_EQ(stop->stop, (std::vector<std::string>{"end"}));
  auto nulls = Completion(R"({"prompt":"x","max_tokens":null,"stop":null,"seed":null})");
  ASSERT_TRUE(nulls.ok());
  EXPECT_FALSE(nulls->max_tokens.has_value());
}

TEST(OpenAiProtocolTest, MalformedBodies) {
  ExpectError(Completion("{not json"), StatusCode::kInvalidArgument, "not valid JSON");
  ExpectError(Completion(""), StatusCode::kInvalidArgument, "not valid JSON");
  ExpectError(Completion("[1,2]"), StatusCode::kInvalidArgument, "must be a JSON object");
  ExpectError(Completion("\"prompt\""), StatusCode::kInvalidArgument, "must be a JSON object");
  ExpectError(Completion("{\"prompt\":\"\xff\xfe\"}"), StatusCode::kInvalidArgument,
              "not valid JSON");
}

TEST(OpenAiProtocolTest, WrongTypesNameTheField) {
  ExpectError(Completion(R"({"prompt":"x","max_tokens":"5"})"), StatusCode::kInvalidArgument,
              "'max_tokens' must be an integer, got string");
  ExpectError(Completion(R"({"prompt":"x","max_tokens":2.5})"), StatusCode::kInvalidArgument,
              "'max_tokens' must be an integer, got number");
  ExpectError(Completion(R"({"prompt":"x","temperature":"hot"})"), StatusCode::kInvalidArgument,
              "'temperature' must be a number");
  ExpectError(Completion(R"({"prompt":"x","stream":1})"), StatusCode::kInvalidArgument,
              "'stream' must be a boolean");
  ExpectError(Completion(R"({"prompt":5})"), StatusCode::kInvalidArgument, "'prompt' must be");
  ExpectError(Completion(R"({"prompt":[1,"a"]})"), StatusCode::kInvalidArgument,
              "'prompt[1]' must be a token id");
  ExpectError(Completion(R"({"prompt":"x","stop":[1]})"), StatusCode::kInvalidArgument,
              "'stop[0]' must be a string");
  ExpectError(Completion(R"({"prompt":"x","stop":7})"), StatusCode::kInvalidArgument,
              "'stop' must be");
  ExpectError(Completion(R"({"prompt":"x","model":3})"), StatusCode::kInvalidArgument,
              "'model' must be a string");
  ExpectError(Completion(R"({"prompt":"x","logprobs":true})"), StatusCode::kInvalidArgument,
              "'logprobs' must be an integer");
  ExpectError(Completion(R"({"prompt":"x","stream":true,"stream_options":[]})"),
              StatusCode::kInvalidArgument, "'stream_options' must be an object");
}

TEST(OpenAiProtocolTest, UnknownModelIsNotFound) {
  ExpectError(Completion(R"({"model":"gpt-4","prompt":"x"})"), StatusCode::kNotFound,
              "`gpt-4` does not exist");
}

TEST(OpenAiProtocolTest, EmptyPrompts) {
  ExpectError(Completion(R"({"prompt":""})"), StatusCode::kInvalidArgument,
              "'prompt' must not be empty");
  ExpectError(Completion(R"({"prompt":[]})"), StatusCode::kInvalidArgument,
              "'prompt' must not be empty");
  ExpectError(Completion(R"({"prompt":[""]})"), StatusCode::kInvalidArgument,
              "'prompt' must not be empty");
  ExpectError(Completion(R"({"prompt":[[]]})"), StatusCode::kInvalidArgument,
              "'prompt' must not be empty");
  ExpectError(Completion(R"({"max_tokens":3})"), StatusCode::kInvalidArgument,
              "'prompt' is required");
}

TEST(OpenAiProtocolTest, TokenIdsOutsideVocabulary) {
  ExpectError(Completion(R"({"prompt":[1,100]})"), StatusCode::kInvalidArgument,
              "'prompt[1]' = 100 is outside the vocabulary [0, 100)");
  ExpectError(Completion(R"({"prompt":[-1]})"), StatusCode::kInvalidArgument,
              "outside the vocabulary");
  ExpectError(Completion(R"({"prompt":[18446744073709551615]})"), StatusCode::kInvalidArgument,
              "outside the vocabulary");
  ExpectError(Completion(R"({"prompt":"x","stop_token_ids":[100]})"), StatusCode::kInvalidArgument,
              "'stop_token_ids[0]' = 100");
}

TEST(OpenAiProtocolTest, UnsupportedValues) {
  ExpectError(Completion(R"({"prompt":"x","n":2})"), StatusCode::kInvalidArgument,
              "'n' = 2 is not supported");
  ExpectError(Completion(R"({"prompt":"x","best_of":3})"), StatusCode::kInvalidArgument,
              "'best_of'");
  ExpectError(Completion(R"({"prompt":"x","echo":true})"), StatusCode::kInvalidArgument, "'echo'");
  ExpectError(Completion(R"({"prompt":["a","b"]})"), StatusCode::kInvalidArgument,
              "2 strings is not supported");
  ExpectError(Completion(R"({"prompt":"x","presence_penalty":0.5})"), StatusCode::kInvalidArgument,
              "'presence_penalty'");
  ExpectError(Chat(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})"),
              StatusCode::kInvalidArgument, "'tools[0].function' must be an object");
  auto n1 = Completion(R"({"prompt":"x","n":1,"best_of":1,"echo":false})");
  EXPECT_TRUE(n1.ok()) << n1.status().ToString();
}

TEST(OpenAiProtocolTest, OutOfRangeValues) {
  ExpectError(Completion(R"({"prompt":"x","max_tokens":0})"), StatusCode::kInvalidArgument,
              "'max_tokens' must be at least 1");
  ExpectError(Completion(R"({"prompt":"x","temperature":-1})"), StatusCode::kInvalidArgument,
              "'temperature'");
  ExpectError(Completion(R"({"prompt":"x","top_p":0})"), StatusCode::kInvalidArgument, "'top_p'");
  ExpectError(Completion(R"({"prompt":"x","top_p":1.5})"), StatusCode::kInvalidArgument, "'top_p'");
  ExpectError(Completion(R"({"prompt":"x","top_k":-2})"), StatusCode::kInvalidArgument, "'top_k'");
  ExpectError(Completion(R"({"prompt":"x","logprobs":21})"), StatusCode::kInvalidArgument,
              "'logprobs' must be in [0, 20]");
  ExpectError(Completion(R"({"prompt":"x","stop":[""]})"), StatusCode::kInvalidArgument,
              "must not be empty");
  ExpectError(Completion(R"({"prompt":"x","stream_options":{"include_usage":true}})"),
              StatusCode::kInvalidArgument,
              "'stream_options' can only be set when 'stream' is true");
}

std::string IdList(int n) {
  std::string ids;
  for (int i = 0; i < n; ++i) ids += (i ? "," : "") + std::to_string(i % 100);
  return "[" + ids + "]";
}

TEST(OpenAiProtocolTest, ListsHaveCountLimitsNamingFieldAndLimit) {
  const ProtocolLimits limits = Limits();
  auto at_limit =
      Completion(R"({"prompt":"x","stop_token_ids":)" + IdList(limits.max_stop_token_ids) + "}");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status().ToString();
  EXPECT_EQ(at_limit->sampling.stop_token_ids.size(),
            static_cast<size_t>(limits.max_stop_token_ids));
  ExpectError(Completion(R"({"prompt":"x","stop_token_ids":)" + IdList(100000) + "}"),
              StatusCode::kInvalidArgument, "'stop_token_ids' has 100000 ids; at most 64");
  std::string stops = "[";
  for (int i = 0; i < 17; ++i)
    stops += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  ExpectError(Completion(R"({"prompt":"x","stop":)" + stops + "]}"), StatusCode::kInvalidArgument,
              "'stop' has 17 strings; at most 16");
  ExpectError(Completion(R"({"prompt":"x","stop":")" + std::string(300, 'a') + "\"}"),
              StatusCode::kInvalidArgument, "at most 256 bytes");
  ExpectError(Completion(R"({"prompt":"x","n":1000000})"), StatusCode::kInvalidArgument,
              "only n = 1");
  ExpectError(Completion(R"({"prompt":"x","logit_bias":{"5":100}})"), StatusCode::kInvalidArgument,
              "'logit_bias' is not supported");
  auto empty_bias = Completion(R"({"prompt":"x","logit_bias":{}})");
  EXPECT_TRUE(empty_bias.ok()) << empty_bias.status().ToString();
}

TEST(OpenAiProtocolTest, ChatMessages) {
  auto r = Chat(R"({"messages":[{"role":"system","content":"be brief"},
    {"role":"user","content":[{"type":"text","text":"hel"},{"type":"text","text":"lo"}]}],
    "logprobs":true,"top_logprobs":2,"max_completion_tokens":4})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->chat.messages.size(), 2u);
  EXPECT_EQ(r->chat.messages[1]["content"], "hello");
  EXPECT_EQ(r->num_logprobs, 2);
  EXPECT_EQ(*r->max_tokens, 4);
  ExpectError(Chat(R"({"messages":[]})"), StatusCode::kInvalidArgument,
              "'messages' must not be empty");
  ExpectError(Chat(R"({})"), StatusCode::kInvalidArgument, "'messages' is required");
  ExpectError(Chat(R"({"messages":"hi"})"), StatusCode::kInvalidArgument,
              "'messages' must be a list");
  ExpectError(Chat(R"({"messages":[{"role":"wizard","content":"x"}]})"),
              StatusCode::kInvalidArgument, "'messages[0].role' = \"wizard\"");
  ExpectError(Chat(R"({"messages":[{"content":"x"}]})"), StatusCode::kInvalidArgument,
              "'messages[0].role'");
  ExpectError(Chat(R"({"messages":[{"role":"user"}]})"), StatusCode::kInvalidArgument,
              "'messages[0].content' is required");
  ExpectError(Chat(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})"),
              StatusCode::kInvalidArgument, "is not supported");
  ExpectError(Chat(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})"),
              StatusCode::kInvalidArgument, "requires 'logprobs'");
}

TEST(OpenAiProtocolTest, ChatToolsAndTemplateKwargs) {
  auto r = Chat(R"({"messages":[{"role":"user","content":"w?"},
    {"role":"assistant","tool_calls":[{"id":"c1","type":"function",
      "function":{"name":"get","arguments":"{\"city\": \"Paris\"}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"sunny"}],
    "tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object",
      "properties":{"z":{},"a":{}}}}}],
    "tool_choice":"auto","add_generation_prompt":false,
    "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->chat.messages[1]["content"].is_null());  // absent content of a tool-call turn
  EXPECT_EQ(r->chat.messages[2]["tool_call_id"], "c1");
  EXPECT_FALSE(r->chat.add_generation_prompt);
  EXPECT_EQ(r->chat.template_kwargs["enable_thinking"], false);
  // The client's key order is kept for the template's tojson.
  EXPECT_EQ(r->chat.tools[0]["function"]["parameters"]["properties"].dump(), R"({"z":{},"a":{}})");

  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  ExpectError(Chat("{" + user + R"(,"tools":{}})"), StatusCode::kInvalidArgument,
              "'tools' must be a list of tools, got object");
  ExpectError(Chat("{" + user + R"(,"tools":[{"type":"retrieval"}]})"),
              StatusCode::kInvalidArgument, "'tools[0].type' must be \"function\"");
  ExpectError(Chat("{" + user + R"(,"tools":[{"type":"function","function":{"name":""}}]})"),
              StatusCode::kInvalidArgument, "'tools[0].function.name' = \"\" must be 1 to 64");
  ExpectError(Chat("{" + user + R"(,"tools":[{"type":"function","function":{"name":"a b"}}]})"),
              StatusCode::kInvalidArgument, "'tools[0].function.name' = \"a b\" must be");
  ExpectError(Chat("{" + user + R"(,"tools":[{"type":"function","function":{"name":7}}]})"),
              StatusCode::kInvalidArgument, "'tools[0].function.name' must be a string");
  ExpectError(Chat("{" + user + R"(,"tools":[{"type":"function","function":{"name":"f",)" +
                   R"("parameters":{"type":"array"}}}]})"),
              StatusCode::kInvalidArgument,
              "'tools[0].function.parameters.type' must be \"object\"");
  ExpectError(Chat("{" + user + R"(,"tools":[{"type":"function","function":{"name":"f",)" +
                   R"("parameters":{"properties":[]}}}]})"),
              StatusCode::kInvalidArgument,
              "'tools[0].function.parameters.properties' must be an object, got array");
  ExpectError(Chat("{" + user +
                   R"(,"tools":[{"type":"function","function":{"name":"f","parameters":1}}]})"),
              StatusCode::kInvalidArgument,
              "'tools[0].function.parameters' must be a JSON Schema object");
  ExpectError(Chat("{" + user + R"(,"tool_choice":"required"})"), StatusCode::kInvalidArgument,
              "'tool_choice' = \"required\" needs 'tools'");
  ExpectError(Chat("{" + user + R"(,"tool_choice":3})"), StatusCode::kInvalidArgument,
              "'tool_choice' must be a string or");
  ExpectError(Chat("{" + user + R"(,"tool_choice":"sometimes"})"), StatusCode::kInvalidArgument,
              "is not one of");
  ExpectError(Chat("{" + user + R"(,"chat_template_kwargs":[1]})"), StatusCode::kInvalidArgument,
              "'chat_template_kwargs' must be an object, got array");
  ExpectError(Chat(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})"),
              StatusCode::kInvalidArgument, "'messages[0].tool_calls[0]' must be");
}

TEST(OpenAiProtocolTest, ToolChoiceModes) {
  const std::string base =
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",)"
      R"("function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  auto parse = [&](const std::string& choice) {
    return Chat(base + R"(,"tool_choice":)" + choice + "}");
  };
  auto r = Chat(base + "}");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tool_choice.mode, ToolChoice::Mode::kAuto);
  r = parse(R"("none")");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tool_choice.mode, ToolChoice::Mode::kNone);
  EXPECT_FALSE(r->chat.tools.is_null());  // still rendered into the prompt
  r = parse(R"("required")");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tool_choice.forces_call());
  r = parse(R"({"type":"function","function":{"name":"get_weather"}})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(r->tool_choice.function, "get_weather");
  ExpectError(parse(R"({"type":"function","function":{"name":"get_time"}})"),
              StatusCode::kInvalidArgument,
              "'tool_choice.function.name' = \"get_time\" is not the name of one of 'tools'");
  ExpectError(parse(R"({"type":"function","function":{}})"), StatusCode::kInvalidArgument,
              "'tool_choice.function.name' must be a string");
  ExpectError(parse(R"({"type":"tool","function":{"name":"get_weather"}})"),
              StatusCode::kInvalidArgument, "'tool_choice.type' must be \"function\"");
  ExpectError(parse(R"("always")"), StatusCode::kInvalidArgument,
              "'tool_choice' = \"always\" is not one of");
}

TEST(OpenAiProtocolTest, FinalizeChecksContextAndVocabulary) {
  auto r = Completion(R"({"prompt":"x","max_tokens":60})");
  ASSERT_TRUE(r.ok());
  GenerateRequest req = *r;
  Status st = FinalizeGenerateRequest(std::vector<int32_t>(5, 1), Limits(), &req);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("maximum context length is 64 tokens"));
  EXPECT_THAT(st.message(),
              HasSubstr("you requested 65 tokens (5 in the prompt, 60 for 'max_tokens')"));
  req = *r;
  EXPECT_TRUE(FinalizeGenerateRequest(std::vector<int32_t>(4, 1), Limits(), &req).ok());
  EXPECT_EQ(req.sampling.max_tokens, 60);
  req = *r;
  EXPECT_THAT(FinalizeGenerateRequest({}, Limits(), &req).message(), HasSubstr("empty"));
  req = *r;
  EXPECT_THAT(FinalizeGenerateRequest({1, 150}, Limits(), &req).message(),
              HasSubstr("outside the vocabulary"));

  auto defaults = Completion(R"({"prompt":"x","logprobs":0})");
  ASSERT_TRUE(defaults.ok());
  req = *defaults;
  ASSERT_TRUE(FinalizeGenerateRequest({1, 2}, Limits(), &req).ok());
  EXPECT_EQ(req.sampling.max_tokens, 16);
  EXPECT_EQ(req.sampling.logprobs, 0);
  auto chat = Chat(R"({"messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(chat.ok());
  req = *chat;
  ASSERT_TRUE(FinalizeGenerateRequest({1, 2, 3}, Limits(), &req).ok());
  EXPECT_EQ(req.sampling.max_tokens, 61);  // the rest of the context
  EXPECT_EQ(req.sampling.logprobs, -1);
}

TEST(OpenAiProtocolTest, TokenizeAndDetokenize) {
  auto t = ParseTokenizeRequest(R"({"prompt":"abc","add_special_tokens":false})", Limits());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->prompt, "abc");
  EXPECT_FALSE(t->add_special_tokens);
  EXPECT_FALSE(ParseTokenizeRequest(R"({})", Limits()).ok());
  EXPECT_FALSE(ParseTokenizeRequest(R"({"prompt":"a","messages":[]})", Limits()).ok());
  auto d = ParseDetokenizeRequest(R"({"tokens":[1,2]})", Limits());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, (std::vector<int32_t>{1, 2}));
  EXPECT_THAT(ParseDetokenizeRequest(R"({"tokens":[100]})", Limits()).status().message(),
              HasSubstr("outside the vocabulary"));
  EXPECT_THAT(ParseDetokenizeRequest(R"({"tokens":"1"})", Limits()).status().message(),
              HasSubstr("'tokens' must be a list"));
}

TEST(OpenAiProtocolTest, ErrorShapeAndStatusMapping) {
  auto body = nlohmann::json::parse(ErrorBody(400, "'n' = 2 is not supported"));
  EXPECT_EQ(body["error"]["message"], "'n' = 2 is not supported");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["code"], 400);
  EXPECT_EQ(nlohmann::json::parse(ErrorBody(401, "x"))["error"]["type"], "authentication_error");
  EXPECT_EQ(HttpStatusFor(InvalidArgument("x")), 400);
  EXPECT_EQ(HttpStatusFor(NotFound("x")), 404);
  EXPECT_EQ(HttpStatusFor(ResourceExhausted("x")), 429);
  EXPECT_EQ(HttpStatusFor(Unavailable("x")), 503);
  EXPECT_EQ(HttpStatusFor(Internal("x")), 500);
  // Invalid UTF-8 never makes serialisation throw.
  EXPECT_EQ(DumpJson(nlohmann::json(std::string("a\xff"))), "\"a\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace pd::server
