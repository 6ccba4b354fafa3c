#include "constrain/json_schema.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "constrain/constrain_test_util.h"
#include "constrain/structured_output.h"

namespace pd::constrain {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

class Schema {
 public:
  explicit Schema(std::string_view text, JsonSchemaOptions o = {}) {
    auto node = JsonSchemaToRegex(json::parse(text), o);
    EXPECT_TRUE(node.ok()) << text << ": " << node.status().ToString();
    if (node.ok()) automaton_ = testing::AutomatonOf(*node);
  }
  bool Accepts(std::string_view text) const {
    return automaton_ != nullptr && testing::FullMatch(*automaton_, text);
  }

 private:
  std::shared_ptr<const TokenAutomaton> automaton_;
};

std::string SchemaError(std::string_view text) {
  auto node = JsonSchemaToRegex(json::parse(text));
  return node.ok() ? "" : node.status().message();
}

TEST(JsonSchemaTest, NestedObjectsWithRequiredAndOptionalMembers) {
  Schema s(R"({"type": "object", "properties": {
      "name": {"type": "string"},
      "age": {"type": "integer"},
      "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "zip": {"type": "string"}},
                  "required": ["city"]}},
    "required": ["name", "address"]})");
  EXPECT_TRUE(s.Accepts(R"({"name":"Ann","age":31,"address":{"city":"Oslo","zip":"0150"}})"));
  EXPECT_TRUE(s.Accepts(R"({"name":"Ann","address":{"city":"Oslo"}})"));
  EXPECT_TRUE(s.Accepts("{\n  \"name\": \"A\\\"n\\u00e9\",\n  \"address\": {\"city\": \"\"}\n}"));
  EXPECT_FALSE(s.Accepts(R"({"name":"Ann"})"));                            // address required
  EXPECT_FALSE(s.Accepts(R"({"address":{"city":"Oslo"},"name":"Ann"})"));  // schema order
  EXPECT_FALSE(s.Accepts(R"({"name":"Ann","address":{"city":"Oslo"},"x":1})"));
  EXPECT_FALSE(s.Accepts(R"({"name":"Ann","age":3.5,"address":{"city":"Oslo"}})"));
  EXPECT_FALSE(s.Accepts(R"({"name":"Ann",,"address":{"city":"Oslo"}})"));
  EXPECT_FALSE(s.Accepts(R"({"name":"Ann","address":{"city":"Oslo"}} )"));  // nothing after
}

TEST(JsonSchemaTest, AllOptionalMembersTakeCommasOnlyBetween) {
  Schema s(R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"boolean"},
                                              "c":{"type":"number"}}})");
  for (const char* yes : {"{}", R"({"b":true})", R"({"a":null,"c":-1.5e3})",
                          R"({"a":null,"b":false,"c":0})", R"({"c":2})"}) {
    EXPECT_TRUE(s.Accepts(yes)) << yes;
  }
  for (const char* no :
       {R"({,"b":true})", R"({"b":true,})", R"({"a":null"c":1})", R"({"c":01})", R"({"c":1.})"}) {
    EXPECT_FALSE(s.Accepts(no)) << no;
  }
}

TEST(JsonSchemaTest, ArraysEnumsConstAndAlternatives) {
  Schema s(R"({"type":"object","properties":{
      "tags": {"type":"array","items":{"enum":["red","green",3,null]},"minItems":1,"maxItems":3},
      "kind": {"const": "point"},
      "v": {"anyOf": [{"type":"integer"}, {"type":"string","maxLength":2}]},
      "w": {"type": ["boolean", "null"]}},
    "required": ["tags","kind","v","w"]})");
  EXPECT_TRUE(s.Accepts(R"({"tags":["red",3],"kind":"point","v":12,"w":null})"));
  EXPECT_TRUE(s.Accepts(R"({"tags":[null, "green", "red"],"kind":"point","v":"ab","w":true})"));
  EXPECT_FALSE(s.Accepts(R"({"tags":[],"kind":"point","v":1,"w":true})"));
  EXPECT_FALSE(s.Accepts(R"({"tags":[3,3,3,3],"kind":"point","v":1,"w":true})"));
  EXPECT_FALSE(s.Accepts(R"({"tags":["blue"],"kind":"point","v":1,"w":true})"));
  EXPECT_FALSE(s.Accepts(R"({"tags":[3],"kind":"line","v":1,"w":true})"));
  EXPECT_FALSE(s.Accepts(R"({"tags":[3],"kind":"point","v":"abc","w":true})"));
}

TEST(JsonSchemaTest, StringLengthsPatternsFormatsAndRefs) {
  Schema s(R"({"$defs": {"code": {"type":"string","pattern":"^[A-Z]{3}-[0-9]+$"}},
    "type":"object","properties":{
      "id": {"$ref": "#/$defs/code"},
      "note": {"type":"string","minLength":2,"maxLength":4},
      "has": {"type":"string","pattern":"ab"},
      "day": {"type":"string","format":"date"}},
    "required":["id","note","has","day"]})");
  EXPECT_TRUE(s.Accepts(R"({"id":"ABC-12","note":"éé","has":"xxabyy","day":"2024-02-29"})"));
  EXPECT_TRUE(s.Accepts(R"({"id":"ABC-1","note":"\n\"x","has":"ab","day":"1999-12-31"})"));
  EXPECT_FALSE(s.Accepts(R"({"id":"AB-12","note":"ok","has":"ab","day":"2024-02-29"})"));
  EXPECT_FALSE(s.Accepts(R"({"id":"ABC-12","note":"x","has":"ab","day":"2024-02-29"})"));
  EXPECT_FALSE(s.Accepts(R"({"id":"ABC-12","note":"12345","has":"ab","day":"2024-02-29"})"));
  EXPECT_FALSE(s.Accepts(R"({"id":"ABC-12","note":"ok","has":"a b","day":"2024-02-29"})"));
  EXPECT_FALSE(s.Accepts(R"({"id":"ABC-12","note":"ok","has":"ab","day":"2024-13-01"})"));
}

// Integer bounds: every integer near the bounds is accepted exactly when it lies inside them.
TEST(JsonSchemaTest, IntegerRangesAcceptExactlyTheirIntegers) {
  struct Range {
    int64_t lo, hi;
    std::string keywords;
  };
  constexpr int64_t kMax = 9999999999999999;
  for (const Range& r : std::vector<Range>{
           {0, 100, R"("minimum":0,"maximum":100)"},
           {-37, 4051, R"("minimum":-37,"maximum":4051)"},
           {-1200, -19, R"("exclusiveMinimum":-1201,"exclusiveMaximum":-18)"},
           {7, kMax, R"("minimum":6.5)"},
           {-kMax, 123, R"("maximum":123.9)"},
           {1999, 2001, R"("minimum":1999,"maximum":2001)"},
       }) {
    Schema s(R"({"type":"integer",)" + r.keywords + "}");
    std::vector<int64_t> probes = {10, 99, 100, 1000, -10, kMax, -kMax};
    for (int64_t center : {r.lo, r.hi, int64_t{0}, (r.lo + r.hi) / 2}) {
      for (int64_t d = -130; d <= 130; ++d) probes.push_back(center + d);
    }
    for (int64_t x : probes) {
      if (x < -kMax || x > kMax) continue;
      EXPECT_EQ(s.Accepts(std::to_string(x)), x >= r.lo && x <= r.hi) << r.keywords << ": " << x;
    }
    EXPECT_FALSE(s.Accepts("-0"));
    EXPECT_FALSE(s.Accepts("007"));
  }
  EXPECT_THAT(SchemaError(R"({"type":"number","minimum":0})"), HasSubstr("integers only"));
  EXPECT_THAT(SchemaError(R"({"type":"integer","minimum":5,"maximum":4})"),
              HasSubstr("no integer lies"));
}

TEST(JsonSchemaTest, WhitespaceRunsAreBounded) {
  JsonSchemaOptions o;
  o.max_whitespace = 2;
  Schema s(R"({"type":"array","items":{"type":"integer"}})", o);
  EXPECT_TRUE(s.Accepts("[ 1,  2 ]"));
  EXPECT_FALSE(s.Accepts("[   1]"));
}

TEST(JsonSchemaTest, UnsupportedSchemasNameTheKeywordAndPlace) {
  EXPECT_THAT(SchemaError(R"({"type":"object","properties":{"age":{"type":"integer",
                                                              "multipleOf":2}}})"),
              HasSubstr("unsupported JSON schema keyword 'multipleOf' at #/properties/age"));
  EXPECT_THAT(SchemaError(R"({"$defs":{"n":{"type":"object","properties":{"next":
                                {"$ref":"#/$defs/n"}}}}, "$ref":"#/$defs/n"})"),
              HasSubstr("recursive '$ref' \"#/$defs/n\""));
  EXPECT_THAT(SchemaError(R"({"type":"object","additionalProperties":true})"),
              HasSubstr("'additionalProperties'"));
  EXPECT_THAT(SchemaError(R"({"type":"string","pattern":"(a"})"), HasSubstr("unterminated group"));
  EXPECT_THAT(SchemaError(R"({"type":"string","format":"email"})"), HasSubstr("'format'"));
  EXPECT_THAT(SchemaError(R"({})"), HasSubstr("any value"));
  EXPECT_THAT(SchemaError(R"({"type":"array"})"), HasSubstr("'items'"));
  EXPECT_THAT(SchemaError(R"({"type":"object","required":["x"]})"), HasSubstr("\"x\""));
  EXPECT_THAT(SchemaError(R"({"$ref":"#/$defs/missing"})"), HasSubstr("points nowhere"));
  EXPECT_THAT(SchemaError(R"({"type":"tuple"})"), HasSubstr("unknown 'type'"));
}

TEST(StructuredOutputCompilerTest, CachesByTextAndNamesTheFieldInErrors) {
  StructuredOutputCompiler compiler(testing::ByteTexts(), 2);
  StructuredOutput a{StructuredOutput::Kind::kRegex, "[ab]+", "guided_regex"};
  auto first = compiler.Compile(a);
  ASSERT_TRUE(first.ok());
  auto again = compiler.Compile(a);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->get(), again->get());
  for (const char* other : {"x", "y", "z"}) {
    ASSERT_TRUE(compiler.Compile({StructuredOutput::Kind::kRegex, other, "guided_regex"}).ok());
  }
  EXPECT_EQ(compiler.cache_size(), 2u);
  auto evicted = compiler.Compile(a);
  ASSERT_TRUE(evicted.ok());
  EXPECT_NE(first->get(), evicted->get());

  auto bad = compiler.Compile({StructuredOutput::Kind::kRegex, "(", "guided_regex"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'guided_regex': regex:"));
  auto choice = compiler.Compile({StructuredOutput::Kind::kChoice, R"(["yes","no"])", "c"});
  ASSERT_TRUE(choice.ok());
  auto state = (*choice)->Start();
  EXPECT_TRUE(state->Allows("ye"));
  EXPECT_FALSE(state->Allows("maybe"));
  state->Advance("no");
  EXPECT_TRUE(state->complete());
}

// A state's mask is exactly the tokens Allows accepts, on a vocabulary of multi-byte tokens.
TEST(TokenAutomatonTest, MaskEqualsAllowsTokenByToken) {
  auto texts = testing::TextsOf({"{", "}", "\"", "\"a", "a\"", ":", "1", "12", "\":", "{\"", "é",
                                 "\xC3", "\xA9", " ", ",", "true", "ab\"}", "x"});
  StructuredOutputCompiler compiler(texts);
  auto c = compiler.Compile({StructuredOutput::Kind::kJsonSchema,
                             R"({"type":"object","properties":{"a":{"type":"string"},
                                 "n":{"type":"integer"}},"required":["a"]})",
                             "guided_json"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (const char* prefix :
       {"", "{", "{\"a\":", "{\"a\":\"x", "{\"a\":\"\xC3", "{\"a\":\"\"", "{\"a\":\"\",\"n\":1"}) {
    auto state = (*c)->Start();
    state->Advance(prefix);
    const engine::TokenMask* mask = state->AllowedTokens();
    ASSERT_NE(mask, nullptr);
    for (int32_t id = 0; id < texts->size(); ++id) {
      EXPECT_EQ(mask->Has(id), state->Allows(texts->bytes[id]))
          << "after '" << prefix << "' token '" << texts->bytes[id] << "'";
    }
    auto clone = state->Clone();
    EXPECT_EQ(clone->AllowedTokens(), mask);
  }
}

}  // namespace
}  // namespace pd::constrain
