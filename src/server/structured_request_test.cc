#include "server/structured_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pd::server {
namespace {

using ::testing::HasSubstr;
using Kind = constrain::StructuredOutput::Kind;

Result<constrain::StructuredOutput> Parse(const std::string& body) {
  return ParseStructuredOutput(nlohmann::json::parse(body), body);
}

TEST(StructuredRequestTest, EachShapeGivesItsKindTextAndField) {
  auto none = Parse(R"({"response_format":{"type":"text"}})");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->kind, Kind::kNone);
  auto object = Parse(R"({"response_format":{"type":"json_object"}})");
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(object->kind, Kind::kJsonObject);
  // The schema keeps its member order ("z" before "a"), which the properties are written in.
  auto schema = Parse(R"({"response_format":{"type":"json_schema","json_schema":{"name":"n",
      "strict":true,"schema":{"type":"object","properties":{"z":{"type":"integer"},
      "a":{"type":"string"}}}}}})");
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  EXPECT_EQ(schema->kind, Kind::kJsonSchema);
  EXPECT_LT(schema->text.find("\"z\""), schema->text.find("\"a\""));
  EXPECT_EQ(schema->field, "response_format.json_schema.schema");
  auto guided = Parse(R"({"guided_json":"{\"type\":\"integer\"}"})");
  ASSERT_TRUE(guided.ok());
  EXPECT_EQ(guided->kind, Kind::kJsonSchema);
  EXPECT_EQ(guided->text, R"({"type":"integer"})");
  auto regex = Parse(R"({"guided_regex":"[0-9]+"})");
  ASSERT_TRUE(regex.ok());
  EXPECT_EQ(regex->kind, Kind::kRegex);
  EXPECT_EQ(regex->text, "[0-9]+");
  auto choice = Parse(R"({"guided_choice":["a","b"]})");
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->kind, Kind::kChoice);
  auto nested = Parse(R"({"structured_outputs":{"regex":"x+"}})");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->kind, Kind::kRegex);
  EXPECT_EQ(nested->field, "structured_outputs.regex");
}

TEST(StructuredRequestTest, BadShapesNameTheField) {
  struct Case {
    const char* body;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"response_format":{"type":"yaml"}})", "'response_format.type' = \"yaml\""},
           {R"({"response_format":{"type":"json_schema"}})", "'response_format.json_schema'"},
           {R"({"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})",
            "'response_format.json_schema.schema' is required"},
           {R"({"guided_regex":3})", "'guided_regex' must be a string"},
           {R"({"guided_choice":[]})", "'guided_choice' must be a non-empty list"},
           {R"({"guided_grammar":"root ::= x"})", "'guided_grammar' is not supported"},
           {R"({"guided_json":"{bad"})", "'guided_json' is not a valid JSON schema text"},
           {R"({"guided_regex":"a","guided_choice":["b"]})",
            "only one structured output may be set, got 'guided_regex' and 'guided_choice'"},
       }) {
    auto r = Parse(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.body;
  }
}

}  // namespace
}  // namespace pd::server
