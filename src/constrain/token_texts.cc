#include "constrain/token_texts.h"

namespace pd::constrain {

std::shared_ptr<const engine::TokenTexts> TokenTextsOf(const model::Tokenizer& tokenizer) {
  auto texts = std::make_shared<engine::TokenTexts>();
  texts->bytes.reserve(tokenizer.vocab_size());
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    auto bytes = tokenizer.TokenBytes(id);
    texts->writes.push_back(bytes.ok() && !tokenizer.IsSpecial(id));
    texts->bytes.push_back(bytes.ok() ? std::move(bytes).value() : std::string());
  }
  return texts;
}

}  // namespace pd::constrain
