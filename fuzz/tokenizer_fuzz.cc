// Fuzzes tokenizer.json loading (model/tokenizer.h Tokenizer::FromJson). A tokenizer that loads
// must encode a few fixed texts (plain words, digits, whitespace runs, non-ASCII, invalid UTF-8,
// special-token look-alikes) into ids of its vocabulary that decode back to the same bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/check.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string_view kTexts[] = {
      "Hello, world! It's 2048 o'clock.",
      "  spaces\t\ttabs\n\nnewlines  ",
      "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82",
      "bad utf-8: \xff\xfe\xc3",
      "<|begin_of_text|><|im_start|>user<|eot_id|></s>",
  };
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto tokenizer = pd::model::Tokenizer::FromJson(text, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) {
    PD_CHECK(!tokenizer.status().message().empty()) << "a refused tokenizer's error names nothing";
    return 0;
  }
  const int vocab_size = (*tokenizer)->vocab_size();
  PD_CHECK(vocab_size > 0);
  for (std::string_view sample : kTexts) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode(sample);
    for (int32_t id : ids) PD_CHECK(id >= 0 && id < vocab_size) << id;
    auto decoded = (*tokenizer)->Decode(ids);
    PD_CHECK(decoded.ok()) << decoded.status().ToString();
    PD_CHECK(*decoded == sample) << "Decode(Encode(text)) differs from the text";
  }
  return 0;
}
