// Structured outputs over HTTP with real processes and a random-weight model (its text is
// arbitrary, so the constraint does all the work): `pdserve serve` (colocated) and `pdserve up`
// with one prefill and one decode instance (the decode instance samples, so it applies the
// constraint). Every completion, greedy and sampled, validates against its JSON schema (Python's
// jsonschema) or fully matches its regex (Python's re); a schema or regex that cannot be compiled
// gets a 400 naming the problem, through the router as well. The same holds with n-gram speculative
// decoding on (drafts checked against the constraint position by position, then verified), where
// the instance that samples counts drafts.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/disagg_process.h"
#include "tests/up_deployment.h"

namespace pd {
namespace {

using json = nlohmann::json;
const std::string kBinary = PDSERVE_BINARY;

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_structured_", name);
}
[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_structured_"));

const std::string& ModelDir() {
  static const std::string dir = testing::MakeModel(kBinary, "tiny", 5, TempPath("model"));
  return dir;
}

const json kSchema = json::parse(R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":10},
    "pos":{"type":"object","properties":{"x":{"type":"integer","minimum":0,"maximum":640},"y":{"type":"number"}},
           "required":["x","y"]},
    "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},
    "code":{"type":"string","pattern":"^[A-Z]{2}[0-9]{2}$"}},
  "required":["name","pos","code"]})");
const std::string kRegex = R"([0-9]{3}-[a-z]{2,4}(!|\?))";

struct Request {
  json body;
  const char* kind;  // for the validator: "schema" | "regex"
  std::string spec;
};

std::vector<Request> Requests() {
  std::vector<Request> out;
  for (int mode = 0; mode < 2; ++mode) {
    json base = {{"model", "m"},
                 {"max_tokens", 120},
                 {"temperature", mode == 0 ? 0.0 : 1.0},
                 {"seed", 3 + mode}};
    json a = base;
    a["prompt"] = "Describe a point";
    a["response_format"] = {{"type", "json_schema"},
                            {"json_schema", {{"name", "p"}, {"schema", kSchema}}}};
    out.push_back({a, "schema", kSchema.dump()});
    json b = base;
    b["prompt"] = "A code";
    b["guided_json"] = kSchema;
    out.push_back({b, "schema", kSchema.dump()});
    json c = base;
    c["prompt"] = "Say something";
    c["guided_regex"] = kRegex;
    out.push_back({c, "regex", kRegex});
  }
  return out;
}

// Posts every request to host:port, then validates the texts in one validator run.
void ExpectValidOutputs(int port, const std::string& where) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120, 0);
  const std::string file = TempPath(where + ".jsonl");
  std::ofstream f(file);
  int n = 0;
  for (const Request& r : Requests()) {
    auto res = client.Post("/v1/completions", r.body.dump(), "application/json");
    ASSERT_TRUE(res) << where;
    ASSERT_EQ(res->status, 200) << where << ": " << res->body;
    const json reply = json::parse(res->body);
    const std::string text = reply["choices"][0]["text"];
    EXPECT_EQ(reply["choices"][0]["finish_reason"], "stop") << where << ": " << text;
    f << json({{"kind", r.kind}, {"spec", r.spec}, {"text", text}}).dump() << "\n";
    ++n;
  }
  f.close();
  const std::string cmd =
      std::string(PD_PYTHON_PATH) + " " + PD_STRUCTURED_VALIDATOR + " " + file + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string report;
  char buf[4096];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) report += buf;
  EXPECT_EQ(pclose(pipe), 0) << where << ": " << report;
  EXPECT_NE(report.find("checked " + std::to_string(n) + " failed 0"), std::string::npos)
      << where << ": " << report;
  // Refused schemas and regexes: 400 in OpenAI's shape, naming the problem.
  json bad = {
      {"model", "m"}, {"prompt", "x"}, {"guided_json", {{"type", "object"}, {"minProperties", 1}}}};
  auto res = client.Post("/v1/completions", bad.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << where;
  EXPECT_NE(res->body.find("unsupported JSON schema keyword 'minProperties'"), std::string::npos)
      << where << ": " << res->body;
  bad.erase("guided_json");
  bad["guided_regex"] = "(?<=a)b";
  res = client.Post("/v1/completions", bad.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << where;
  EXPECT_NE(res->body.find("look-arounds"), std::string::npos) << where << ": " << res->body;
}

const std::string kNgram =
    R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":2})";

bool HaveJsonschema() {
  return std::system(PD_PYTHON_PATH " -c 'import jsonschema' >/dev/null 2>&1") == 0;
}

void ServeAndValidate(const std::vector<std::string>& extra, const std::string& where) {
  std::mt19937 rng(static_cast<unsigned>(::getpid()) * 6151u + extra.size());
  const int port = testing::PickPortBlock(rng, 24000);
  testing::Process serve;
  ASSERT_TRUE(testing::StartAndWaitFor(serve,
                                       testing::ServeArgv(kBinary, ModelDir(), port, 256, extra),
                                       "serving m on", std::chrono::seconds(60)));
  ExpectValidOutputs(port, where);
  if (!extra.empty()) {
    EXPECT_GT(testing::MetricSum("127.0.0.1", port, "pdserve:spec_decode_num_drafts_total"), 0);
  }
}

void UpAndValidate(const std::vector<std::string>& extra, const std::string& where) {
  testing::UpDeployment up(kBinary, ModelDir(), 1, 1, extra);
  ASSERT_TRUE(up.started());
  ExpectValidOutputs(up.router_port(), where);
  if (!extra.empty()) {  // the decode instance samples, so it drafts
    EXPECT_GT(testing::MetricSum(testing::kUpHost, up.port("decode 0"),
                                 "pdserve:spec_decode_num_drafts_total"),
              0);
  }
  up.ExpectPagesFree();
}

TEST(StructuredItest, ColocatedServeValidates) {
  if (!HaveJsonschema()) GTEST_SKIP() << "no Python jsonschema (scripts/install-deps.sh)";
  ServeAndValidate({}, "serve");
}

TEST(StructuredItest, DisaggregatedUpValidatesOnDecode) {
  if (!HaveJsonschema()) GTEST_SKIP() << "no Python jsonschema (scripts/install-deps.sh)";
  UpAndValidate({}, "up");
}

TEST(StructuredItest, ColocatedServeWithNgramSpeculationValidates) {
  if (!HaveJsonschema()) GTEST_SKIP() << "no Python jsonschema (scripts/install-deps.sh)";
  ServeAndValidate({"--speculative-config", kNgram}, "serve-ngram");
}

TEST(StructuredItest, DisaggregatedUpWithNgramSpeculationValidatesOnDecode) {
  if (!HaveJsonschema()) GTEST_SKIP() << "no Python jsonschema (scripts/install-deps.sh)";
  UpAndValidate({"--speculative-config", kNgram}, "up-ngram");
}

}  // namespace
}  // namespace pd
