// Which models a disaggregated deployment (serve --role prefill|decode, up) can serve: the KV
// transfer describes a page as per-head K and V (messenger/shard_plan.h), which an MLA latent page
// (kv_cache.h) is not, so deepseek_v3 runs colocated until the transfer learns latent pages.
#pragma once

#include "common/status.h"
#include "model/config.h"

namespace pd::engine {

// OkStatus, or Unimplemented naming the model type and what to do instead.
Status CheckDisaggregatedModel(const model::ModelConfig& config);

}  // namespace pd::engine
