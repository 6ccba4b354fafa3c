// DeepSeek-V3's chat template and special tokens, for the synthetic deepseek_v3 tokenizer.
//
// The template is DeepSeek-V3's own, copied verbatim from the chat_template of the
// tokenizer_config.json that deepseek-ai/DeepSeek-V3 publishes (MIT licence; see
// LICENSE-deepseek-v3 beside this file), so that synthetic deepseek_v3 models render chats exactly
// as the real checkpoints do.
#include "model/synthetic_tokenizer_arch.h"

namespace pd::model::internal {

const char kDeepseekV3ChatTemplate[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true,"
    " system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp"
    " = false %}"
    "{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}"
    "{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message"
    " in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' +"
    " message['content']}}"
    "{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%-"
    " set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls']%}{%- if not ns.is_first"
    " %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] +"
    " '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' +"
    " tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type']"
    " + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' +"
    " tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}"
    "{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + "
    "'<｜end▁of▁sentence｜>'}}"
    "{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] +"
    " '<｜end▁of▁sentence｜>'}}"
    "{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}"
    "{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' +"
    " message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' +"
    " message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}"
    "{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";

const char* const kDeepseekV3SpecialTokens[] = {
    "<｜begin▁of▁sentence｜>",  "<｜end▁of▁sentence｜>",  "<｜User｜>",
    "<｜Assistant｜>",          "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",    "<｜tool▁call▁end｜>",    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>"};
const size_t kNumDeepseekV3SpecialTokens = std::size(kDeepseekV3SpecialTokens);

}  // namespace pd::model::internal
