// Internal to model_writer*.cc: the qwen3_moe / deepseek_v3 presets and overrides.
#pragma once

#include <string_view>

#include "common/status.h"
#include "model/config.h"
#include "model/model_writer.h"

namespace pd::model::internal {

// Fills *c (already holding the arch's conventions) with the named preset's shapes.
Status MoePreset(std::string_view preset, ModelConfig* c);
// Applies SyntheticModelOptions' MoE/MLA overrides; InvalidArgument for one that does not apply to
// the arch or is out of range.
Status ApplyMoeOverrides(const SyntheticModelOptions& o, ModelConfig* c);

}  // namespace pd::model::internal
