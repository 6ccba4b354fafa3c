// The official OpenAI Node SDK against `pdserve serve` and `pdserve up` (1 prefill + 1 decode) on a
// random-weight qwen3 model with --tool-call-parser hermes and --reasoning-parser deepseek_r1:
// tests/openai_sdk/chat_tools.cjs checks tool_calls (forced by tool_choice, so decoding is
// constrained; whole and streamed) and reasoning_content. Skips only where node is absent; the
// SDK itself is installed by scripts/install-deps.sh.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "tests/disagg_process.h"

namespace pd {
namespace {

const std::string kBinary = PDSERVE_BINARY;
const std::string kSourceDir = PD_SOURCE_DIR;
const std::string kScript = kSourceDir + "/tests/openai_sdk/chat_tools.cjs";
const std::string kTemplate = kSourceDir + "/tests/openai_sdk/chatml_tools.jinja";

class OpenAiSdkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v node >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "node is absent (scripts/install-deps.sh installs it)";
    }
    ASSERT_TRUE(
        std::filesystem::exists(kSourceDir + "/.cache/npm/node_modules/openai/package.json"))
        << "the OpenAI Node SDK is not in .cache/npm: run scripts/install-deps.sh";
    dir_ = (std::filesystem::temp_directory_path() /
            ("pdserve_sdk_model_" + std::to_string(::getpid())))
               .string();
    testing::MakeModel(kBinary, "tiny", 3, dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // Runs the SDK script against base_url; its output on failure.
  void RunScript(const std::string& base_url) {
    testing::Process node;
    ASSERT_TRUE(node.Start({"/usr/bin/env", "node", kScript, base_url, "m"}));
    const int rc = node.Wait(std::chrono::seconds(300));
    EXPECT_EQ(rc, 0) << node.output();
    EXPECT_NE(node.output().find("\nok"), std::string::npos) << node.output();
  }

  std::vector<std::string> ParserArgs() const {
    return {"--tool-call-parser", "hermes",          "--reasoning-parser",
            "deepseek_r1",        "--chat-template", kTemplate};
  }

  std::string dir_;
};

TEST_F(OpenAiSdkTest, ServeGivesToolCallsAndReasoning) {
  testing::Process serve;
  std::vector<std::string> argv = testing::ServeArgv(kBinary, dir_, 0, 1024, ParserArgs());
  ASSERT_TRUE(serve.Start(argv));
  const std::string line = serve.WaitForLine("on http://127.0.0.1:", std::chrono::seconds(60));
  ASSERT_FALSE(line.empty()) << serve.output();
  const int port = std::atoi(line.substr(line.rfind(':') + 1).c_str());
  RunScript("http://127.0.0.1:" + std::to_string(port) + "/v1");
  EXPECT_EQ(serve.Stop(SIGTERM, std::chrono::seconds(30)), 0) << serve.output();
}

TEST_F(OpenAiSdkTest, UpGivesToolCallsAndReasoning) {
  std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u);
  const int port = testing::PickPortBlock(rng, 27000);
  std::vector<std::string> extra = {"--threads",       "1",   "--served-model-name", "m",
                                    "--max-model-len", "1024"};
  for (const std::string& a : ParserArgs()) extra.push_back(a);
  testing::Process up;
  ASSERT_TRUE(testing::StartAndWaitFor(up, testing::UpArgv(kBinary, dir_, 1, 1, port, extra),
                                       "router (OpenAI API) on", std::chrono::seconds(120)));
  RunScript("http://127.0.0.1:" + std::to_string(port) + "/v1");
  EXPECT_EQ(up.Stop(SIGINT, std::chrono::seconds(60)), 0) << up.output();
}

// Bad templates and parser names stop `serve` at load with the reason, never a crash.
TEST(ServeLoadErrors, BadTemplatesAndParserNamesAreClearErrors) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("pdserve_bad_template_" + std::to_string(::getpid())))
                              .string();
  testing::MakeModel(kBinary, "tiny", 3, dir);
  struct Case {
    std::string template_text;  // "": no --chat-template
    std::vector<std::string> flags;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"{{ messages | nofilter }}", {}, "unknown filter 'nofilter'"},
      {"{% for m in messages %}{{ m.content }}", {}, "1:"},
      {"{{ messages[0].content ", {}, "bad.jinja"},
      {"", {"--tool-call-parser", "mistral"}, "'mistral' is not one of hermes"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> extra = c.flags;
    if (!c.template_text.empty()) {
      extra.push_back("--chat-template");
      extra.push_back(testing::WriteTempFile(dir + "/bad.jinja", c.template_text));
    }
    testing::Process serve;
    ASSERT_TRUE(serve.Start(testing::ServeArgv(kBinary, dir, 0, 256, extra)));
    EXPECT_EQ(serve.Wait(std::chrono::seconds(60)), 1) << serve.output();
    EXPECT_NE(serve.output().find(c.expected), std::string::npos) << serve.output();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace pd
