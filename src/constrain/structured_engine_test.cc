// Structured outputs through the Engine on a real (synthetic, random-weight) model: its text is
// arbitrary, so the constraint does all the work. Every completion, greedy and sampled, must parse
// and validate against its JSON schema (checked by Python's jsonschema, an independent validator)
// or fully match its regex (Python's re).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "constrain/structured_output.h"
#include "constrain/token_texts.h"
#include "engine/engine.h"
#include "model/model_writer.h"
#include "model/weights.h"

namespace pd::constrain {
namespace {

struct TinyModel {
  model::ModelWeights weights;
  std::unique_ptr<model::Tokenizer> tokenizer;
};

const TinyModel& Model() {
  static TinyModel* m = [] {
    std::string dir = ::testing::TempDir() + "pd_structured_XXXXXX";
    PD_CHECK(mkdtemp(dir.data()) != nullptr);
    model::SyntheticModelOptions o;
    o.preset = "tiny";
    o.seed = 11;
    o.out_dir = dir;
    Status s = model::WriteSyntheticModel(o);
    PD_CHECK(s.ok()) << s.ToString();
    auto* model = new TinyModel();
    auto weights = model::LoadModelWeights(dir);
    PD_CHECK(weights.ok()) << weights.status().ToString();
    model->weights = std::move(weights).value();
    auto tok = model::Tokenizer::Load(dir);
    PD_CHECK(tok.ok()) << tok.status().ToString();
    model->tokenizer = std::move(tok).value();
    std::filesystem::remove_all(dir);
    return model;
  }();
  return *m;
}

bool PythonHasJsonschema() {
  return std::system(PD_PYTHON " -c 'import jsonschema' >/dev/null 2>&1") == 0;
}

struct Case {
  StructuredOutput::Kind kind;
  std::string spec;
};

const std::vector<Case>& Cases() {
  using K = StructuredOutput::Kind;
  static const std::vector<Case> cases = {
      {K::kJsonSchema, R"({"type":"object","properties":{
          "name":{"type":"string","maxLength":12},
          "address":{"type":"object","properties":{"city":{"type":"string","maxLength":8},
                     "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city","zip"]},
          "score":{"type":"number"},"vip":{"type":"boolean"}},
          "required":["name","address","score"]})"},
      {K::kJsonSchema, R"({"type":"object","properties":{
          "tags":{"type":"array","items":{"enum":["red","green","blue"]},"minItems":1,"maxItems":4},
          "points":{"type":"array","items":{"type":"object","properties":{
              "x":{"type":"integer","minimum":-50,"maximum":50},"y":{"type":"integer"}},"required":["x","y"]},"maxItems":3}},
          "required":["tags","points"]})"},
      {K::kJsonSchema, R"({"$defs":{"id":{"type":"string","pattern":"^[A-Z]{2}-[0-9]{3}$"}},
          "type":"object","properties":{"id":{"$ref":"#/$defs/id"},
          "kind":{"anyOf":[{"const":"a"},{"type":"integer"},{"type":"null"}]},
          "day":{"type":"string","format":"date"}},"required":["id","kind"]})"},
      {K::kRegex, R"((\+1 )?\(\d{3}\) \d{3}-\d{4})"},
      {K::kRegex, R"([a-z]+@[a-z]+\.(com|org|net))"},
      {K::kRegex, R"(\w{1,5}( \w{1,5}){2,4}\.)"},
      {K::kChoice, R"(["positive","negative","neutral"])"},
      {K::kJsonObject, ""},
  };
  return cases;
}

TEST(StructuredEngineTest, EveryCompletionValidatesGreedyAndSampled) {
  if (!PythonHasJsonschema())
    GTEST_SKIP() << PD_PYTHON << " lacks the jsonschema module (scripts/install-deps.sh)";
  const TinyModel& m = Model();
  StructuredOutputCompiler compiler(TokenTextsOf(*m.tokenizer));
  engine::EngineOptions o;
  o.runner.num_pages = 256;
  o.runner.num_threads = 2;
  o.scheduler.max_num_seqs = 32;
  o.scheduler.max_model_len = 256;
  auto engine = engine::Engine::Create(m.weights, o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  struct Sent {
    size_t case_index;
    std::string text;
    engine::FinishReason finish = engine::FinishReason::kNone;
  };
  std::map<int64_t, Sent> sent;
  int64_t next_id = 0;
  const std::vector<std::string> prompts = {"Give me the data", "x"};
  for (size_t c = 0; c < Cases().size(); ++c) {
    auto constraint = compiler.Compile({Cases()[c].kind, Cases()[c].spec, "test"});
    ASSERT_TRUE(constraint.ok()) << constraint.status().ToString();
    for (int mode = 0; mode < 3; ++mode) {
      for (const std::string& prompt : prompts) {
        engine::Request r;
        r.id = next_id++;
        r.prompt_ids = m.tokenizer->Encode(prompt);
        r.sampling.temperature = mode == 0 ? 0.0f : mode == 1 ? 1.0f : 0.7f;
        r.sampling.top_p = mode == 2 ? 0.9f : 1.0f;
        r.sampling.seed = 100 + r.id;
        r.sampling.max_tokens = 200;
        r.sampling.constraint = *constraint;
        ASSERT_TRUE((*engine)->AddRequest(r).ok());
        sent[r.id] = {c, ""};
      }
    }
  }
  const engine::TokenTexts& texts = *compiler.texts();
  while ((*engine)->HasWork()) {
    auto outputs = (*engine)->Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status().ToString();
    for (const engine::RequestOutput& out : *outputs) {
      Sent& s = sent[out.request_id];
      for (int32_t id : out.new_token_ids) {
        if (texts.writes[id]) s.text += texts.bytes[id];
      }
      if (out.finished()) s.finish = out.finish_reason;
    }
  }
  const std::string file = ::testing::TempDir() + "pd_structured_cases.jsonl";
  {
    std::ofstream f(file);
    for (const auto& [id, s] : sent) {
      const Case& c = Cases()[s.case_index];
      // Ended by EOS, never cut by max_tokens: the constraint closed the text in time.
      EXPECT_EQ(s.finish, engine::FinishReason::kStop) << "request " << id << ": " << s.text;
      const char* kind = c.kind == StructuredOutput::Kind::kJsonSchema   ? "schema"
                         : c.kind == StructuredOutput::Kind::kJsonObject ? "object"
                                                                         : "regex";
      std::string spec = c.spec;
      if (c.kind == StructuredOutput::Kind::kChoice) {
        spec.clear();
        for (const auto& choice : nlohmann::json::parse(c.spec))
          spec += (spec.empty() ? "" : "|") + choice.get<std::string>();
      }
      f << nlohmann::json({{"kind", kind}, {"spec", spec}, {"text", s.text}}).dump() << "\n";
    }
  }
  const std::string cmd =
      std::string(PD_PYTHON) + " " + PD_STRUCTURED_VALIDATOR + " " + file + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string report;
  char buf[4096];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) report += buf;
  const int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << report;
  EXPECT_NE(report.find("checked " + std::to_string(sent.size()) + " failed 0"), std::string::npos)
      << report;
  if (std::getenv("PD_KEEP") == nullptr) std::filesystem::remove(file);
}

}  // namespace
}  // namespace pd::constrain
