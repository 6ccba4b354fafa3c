// Test helper: one tiny synthetic checkpoint per architecture (`make-model --preset tiny`, bf16,
// seed 7), written once into a temporary directory and loaded, for engine tests on real models.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "common/check.h"
#include "model/model_writer.h"
#include "model/weights.h"

namespace pd::engine::testing {

inline const model::ModelWeights& SyntheticTinyModel(model::Arch arch) {
  static std::map<model::Arch, model::ModelWeights>* models =
      new std::map<model::Arch, model::ModelWeights>();
  auto it = models->find(arch);
  if (it != models->end()) return it->second;
  std::string tmpl = ::testing::TempDir() + "pd_engine_model_XXXXXX";
  PD_CHECK(mkdtemp(tmpl.data()) != nullptr);
  model::SyntheticModelOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.dtype = model::DType::kBF16;
  o.seed = 7;
  o.out_dir = tmpl;
  Status s = model::WriteSyntheticModel(o);
  PD_CHECK(s.ok()) << s.ToString();
  auto weights = model::LoadModelWeights(tmpl);
  PD_CHECK(weights.ok()) << weights.status().ToString();
  std::filesystem::remove_all(tmpl);  // the mapping stays valid after unlink
  return models->emplace(arch, std::move(weights).value()).first->second;
}

}  // namespace pd::engine::testing
