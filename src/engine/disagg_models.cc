#include "engine/disagg_models.h"

#include <string>

namespace pd::engine {

Status CheckDisaggregatedModel(const model::ModelConfig& config) {
  if (!config.is_mla()) return OkStatus();
  return Unimplemented(
      std::string(model::ArchName(config.arch)) +
      " keeps a Multi-head Latent Attention KV cache (one " +
      std::to_string(config.mla.latent_dim()) +
      "-value latent row per token), which KV transfers between prefill and decode instances "
      "cannot carry yet: serve it colocated (serve without --role prefill/decode, not up)");
}

}  // namespace pd::engine
