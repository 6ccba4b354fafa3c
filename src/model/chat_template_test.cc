#include "model/chat_template.h"

#include <gtest/gtest.h>

#include "common/file_util.h"
#include "model/tokenizer.h"
#include "model/tokenizer_testing.h"

namespace pd::model {
namespace {

const char kChatML[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplate, RendersMessagesToolsSpecialTokensAndKwargs) {
  auto t = ChatTemplate::Create(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
      "{% if tools %}{{ tools | tojson }}{% endif %}{{ tools is none }}"
      "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}"
      "{% if add_generation_prompt %}>{% endif %}",
      {{"bos_token", "<s>"}}, "test");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ChatInput input;
  input.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "日本"}])");
  EXPECT_EQ((*t)->Render(input).value(), "<s>[user:日本]True>");
  input.tools =
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  input.template_kwargs = {{"enable_thinking", false}};
  input.add_generation_prompt = false;
  EXPECT_EQ((*t)->Render(input).value(),
            R"(<s>[user:日本][{"type": "function", "function": {"name": "f"}}]False<no-think>)");
}

TEST(ChatTemplate, ErrorsNameTheTemplate) {
  auto bad = ChatTemplate::Create("{% for x in %}", {}, "dir/tokenizer_config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "dir/tokenizer_config.json: chat template: template 1:13: expected an expression, got "
            "'%}'");
  auto raises = ChatTemplate::Create(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
      {}, "t.jinja");
  ASSERT_TRUE(raises.ok());
  const std::vector<ChatMessage> sys = {{"system", "x"}};
  auto r = (*raises)->Render(ChatInput::FromMessages(sys, true));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "the chat template (t.jinja) failed: template 1:39: raise_exception: first must be "
            "user");
}

TEST(ChatTemplate, PicksTemplateFileJinjaFileOrConfig) {
  testing::ScratchDir dir("chat_pick");
  ASSERT_TRUE(
      WriteStringToFile(dir.path() + "/tokenizer.json", testing::SmallTokenizer().dump()).ok());
  const std::string config = dir.path() + "/tokenizer_config.json";
  const std::vector<ChatMessage> hi = {{"user", " hi "}};
  const ChatInput input = ChatInput::FromMessages(hi, true);

  // A list of named templates: the "default" one is used.
  const nlohmann::json named = {{"chat_template",
                                 {{{"name", "tool_use"}, {"template", "tool"}},
                                  {{"name", "default"}, {"template", kChatML}}}}};
  ASSERT_TRUE(WriteStringToFile(config, named.dump()).ok());
  auto chatml = Tokenizer::Load(dir.path());
  ASSERT_TRUE(chatml.ok()) << chatml.status().ToString();
  EXPECT_EQ((*chatml)->ApplyChatTemplate(input).value(),
            "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n");

  // chat_template.jinja beside it wins over the config; --chat-template FILE over both.
  ASSERT_TRUE(WriteStringToFile(dir.path() + "/chat_template.jinja", "jinja file").ok());
  auto jinja = Tokenizer::Load(dir.path());
  ASSERT_TRUE(jinja.ok()) << jinja.status().ToString();
  EXPECT_EQ((*jinja)->ApplyChatTemplate(input).value(), "jinja file");
  ASSERT_TRUE(WriteStringToFile(dir.path() + "/other.jinja", "{{ messages | length }}").ok());
  auto flag = Tokenizer::Load(dir.path(), dir.path() + "/other.jinja");
  ASSERT_TRUE(flag.ok()) << flag.status().ToString();
  EXPECT_EQ((*flag)->ApplyChatTemplate(input).value(), "1");

  // A template that does not parse fails the load, naming the file.
  ASSERT_TRUE(WriteStringToFile(dir.path() + "/chat_template.jinja", "{{ x | nosuch }}").ok());
  auto broken = Tokenizer::Load(dir.path());
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("chat_template.jinja: chat template: template 1:8: "
                                           "unknown filter 'nosuch'"),
            std::string::npos)
      << broken.status().message();
  auto missing = Tokenizer::Load(dir.path(), dir.path() + "/absent.jinja");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::model
