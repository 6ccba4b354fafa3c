// Fuzzes Hugging Face config.json parsing (model/config.h ParseModelConfig). An accepted config
// must have sizes the engine can use (q_size and kv_size computed without overflow, which UBSan
// checks) and survive a round trip through ModelConfigToJson unchanged.
#include <cstdint>
#include <string>

#include "common/check.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = pd::model::ParseModelConfig(text, "fuzz/config.json");
  if (!config.ok()) {
    PD_CHECK(!config.status().message().empty()) << "a refused config's error names no problem";
    return 0;
  }
  PD_CHECK(config->q_size() > 0 && config->kv_size() > 0);
  auto again = pd::model::ParseModelConfig(pd::model::ModelConfigToJson(*config), "round trip");
  PD_CHECK(again.ok()) << again.status().ToString();
  PD_CHECK(again->arch == config->arch && again->vocab_size == config->vocab_size &&
           again->hidden_size == config->hidden_size && again->num_layers == config->num_layers &&
           again->num_heads == config->num_heads && again->num_kv_heads == config->num_kv_heads &&
           again->head_dim == config->head_dim && again->eos_token_id == config->eos_token_id &&
           again->bos_token_id == config->bos_token_id)
      << "config.json round trip changed the config";
  // Every field, the MoE / MLA / yarn ones included, survives: writing again gives the same text.
  PD_CHECK(pd::model::ModelConfigToJson(*again) == pd::model::ModelConfigToJson(*config))
      << "config.json round trip changed a field";
  return 0;
}
