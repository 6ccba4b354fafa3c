#include <gtest/gtest.h>

#include "common/file_util.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"
#include "model/tokenizer_testing.h"

namespace pd::model {
namespace {

using internal::DetectChatTemplate;

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."}, {"user", "  What is 2+2?\n"}, {"assistant", "4"}};

TEST(ChatTemplate, DetectsFamilies) {
  EXPECT_EQ(DetectChatTemplate(internal::kChatMLJinjaTemplate), ChatTemplateKind::kChatML);
  EXPECT_EQ(DetectChatTemplate(internal::kLlama3JinjaTemplate), ChatTemplateKind::kLlama3);
  EXPECT_EQ(DetectChatTemplate("{{ bos_token }}{% for m in messages %}[INST]{% endfor %}"),
            ChatTemplateKind::kNone);
  EXPECT_EQ(DetectChatTemplate(""), ChatTemplateKind::kNone);
}

TEST(ChatTemplate, RendersChatML) {
  EXPECT_EQ(internal::RenderChatML(kConversation, /*add_generation_prompt=*/true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\n  What is 2+2?\n<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(internal::RenderChatML({}, /*add_generation_prompt=*/false), "");
  EXPECT_EQ(internal::RenderChatML(std::vector<ChatMessage>{{"user", "hi"}}, false),
            "<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplate, RendersLlama3WithTrimmedContent) {
  EXPECT_EQ(
      internal::RenderLlama3(kConversation, /*add_generation_prompt=*/true, "<|begin_of_text|>"),
      "<|begin_of_text|>"
      "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Jinja's trim strips Unicode whitespace too (U+3000, U+00A0), and only at the ends.
  EXPECT_EQ(
      internal::RenderLlama3(std::vector<ChatMessage>{{"user", "\u3000a b\u00a0\n"}}, false, "<s>"),
      "<s><|start_header_id|>user<|end_header_id|>\n\na b<|eot_id|>");
  EXPECT_EQ(internal::RenderLlama3({}, true, "<s>"),
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, PicksTemplateFromTokenizerConfig) {
  testing::ScratchDir dir("chat_pick");
  ASSERT_TRUE(
      WriteStringToFile(dir.path() + "/tokenizer.json", testing::SmallTokenizer().dump()).ok());
  const std::string config = dir.path() + "/tokenizer_config.json";
  const std::vector<ChatMessage> hi = {{"user", " hi "}};

  ASSERT_TRUE(
      WriteStringToFile(
          config, nlohmann::json{{"chat_template", std::string(internal::kLlama3JinjaTemplate)},
                                 {"bos_token", "<|user|>"}}
                      .dump())
          .ok());
  auto llama = Tokenizer::Load(dir.path());
  ASSERT_TRUE(llama.ok()) << llama.status().ToString();
  EXPECT_EQ((*llama)->chat_template(), ChatTemplateKind::kLlama3);
  EXPECT_EQ((*llama)->ApplyChatTemplate(hi, false).value(),
            "<|user|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");

  // A list of named templates: the "default" one is used.
  const nlohmann::json named = {
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "{{ '<|start_header_id|>' }}"}},
        {{"name", "default"}, {"template", std::string(internal::kChatMLJinjaTemplate)}}}}};
  ASSERT_TRUE(WriteStringToFile(config, named.dump()).ok());
  auto chatml = Tokenizer::Load(dir.path());
  ASSERT_TRUE(chatml.ok()) << chatml.status().ToString();
  EXPECT_EQ((*chatml)->chat_template(), ChatTemplateKind::kChatML);
  EXPECT_EQ((*chatml)->ApplyChatTemplate(hi, true).value(),
            "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n");

  ASSERT_TRUE(WriteStringToFile(config, R"({"chat_template": "[INST] {{ x }}"})").ok());
  auto none = Tokenizer::Load(dir.path());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->chat_template(), ChatTemplateKind::kNone);
  EXPECT_EQ((*none)->ApplyChatTemplate(hi, true).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pd::model
