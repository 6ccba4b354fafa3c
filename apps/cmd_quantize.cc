// pdserve quantize: converts a bf16/f32/f16 checkpoint to the FP8 format DeepSeek-V3 and
// Qwen3-FP8 ship (F8_E4M3 projections with `weight_scale_inv` per 128x128 block; embeddings,
// norms, router and lm_head bf16; config.json's quantization_config), which pdserve serves as is.
//
//   pdserve quantize --model models/llama-1b --out models/llama-1b-fp8 --dtype fp8
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/command.h"
#include "model/dtype.h"
#include "model/fp8_quant.h"

namespace pd::apps {
namespace {

struct QuantizeFlags {
  std::string model;
  std::string out;
  std::string dtype = "fp8";
  size_t shard_mb = 0;
};

int RunQuantize(const QuantizeFlags& f) {
  auto dtype = model::ParseDTypeFlag(f.dtype);
  if (!dtype.ok() || *dtype != model::DType::kF8E4M3) {
    std::fprintf(stderr, "quantize: --dtype %s: only fp8 is supported\n", f.dtype.c_str());
    return 2;
  }
  model::QuantizeOptions o;
  o.model_dir = f.model;
  o.out_dir = f.out;
  o.max_shard_bytes = f.shard_mb << 20;
  const auto start = std::chrono::steady_clock::now();
  Status s = model::QuantizeCheckpoint(o);
  if (!s.ok()) {
    std::fprintf(stderr, "quantize: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  std::printf("wrote the fp8 checkpoint of %s to %s in %.1f s\n", f.model.c_str(), f.out.c_str(),
              elapsed.count());
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(quantize, "Convert a checkpoint to FP8 (HF's block-scaled e4m3 format)",
                    [](CLI::App* app) {
                      auto f = std::make_shared<QuantizeFlags>();
                      app->add_option("--model", f->model, "input model directory")->required();
                      app->add_option("--out", f->out, "output directory (created)")->required();
                      app->add_option("--dtype", f->dtype, "fp8")->capture_default_str();
                      app->add_option("--shard-mb", f->shard_mb,
                                      "write shards of at most this many MiB (0: one file)");
                      return [f] { return RunQuantize(*f); };
                    });

}  // namespace pd::apps
