// `pdserve profile`: times this engine's forward pass over prefill and decode batch shapes and
// fits DistServe's step-time forms; writes the latency-model JSON that `pdserve simulate` and
// `pdserve plan` take with --profile FILE (alias --latency-model FILE).
//
//   pdserve profile --model models/qwen3-small --threads 1 --quick --out profile.json
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "apps/command.h"
#include "apps/matmul_flag.h"
#include "common/file_util.h"
#include "engine/model_runner.h"
#include "model/weights.h"
#include "planner/profiler.h"

namespace pd::apps {
namespace {

struct ProfileFlags {
  std::string model;
  int threads = 1;
  std::string out;
  bool quick = false;
  int page_size = 16;
  std::string kv_layout = "hnd";
  std::string matmul = "f32";                        // engine::MatmulPrecision, as serve
  int repeats = 0;                                   // 0: the sweep's default
  std::vector<int> decode_batches, decode_contexts;  // both given: the decode grid
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "pdserve profile: %s\n", message.c_str());
  return 1;
}

int RunProfile(const ProfileFlags& f) {
  if (f.threads < 1) return Fail("--threads must be >= 1");
  auto layout = engine::ParseKvLayout(f.kv_layout);
  if (!layout.ok()) return Fail("--kv-layout: " + layout.status().message());
  auto matmul = engine::ParseMatmulPrecision(f.matmul);
  if (!matmul.ok()) return Fail("--matmul: " + matmul.status().message());
  WarnIfMatmulFallsBack("pdserve profile", *matmul);
  auto weights = model::LoadModelWeights(f.model);
  if (!weights.ok()) return Fail(weights.status().ToString());
  const int max_pos = weights->config.max_position_embeddings > 0
                          ? weights->config.max_position_embeddings
                          : 1 << 20;
  planner::ProfileOptions po =
      planner::DefaultProfileOptions(f.quick, 1024, std::min(max_pos, 2048));
  if (f.repeats > 0) po.repeats = f.repeats;
  if (!f.decode_batches.empty() || !f.decode_contexts.empty()) {
    const Status s =
        planner::SetDecodeGrid(&po, f.decode_batches, f.decode_contexts, std::min(max_pos, 2048));
    if (!s.ok()) return Fail("--decode-batches / --decode-contexts: " + s.message());
  }
  po.progress = [](const std::string& what) {
    std::fprintf(stderr, "pdserve profile: %s\n", what.c_str());
  };
  engine::ModelRunnerOptions ro;
  ro.kv.page_size = f.page_size;
  ro.kv.layout = *layout;
  ro.num_threads = f.threads;
  ro.matmul = *matmul;
  ro.num_pages = planner::PagesNeeded(po, f.page_size);
  auto runner = engine::ModelRunner::Create(*weights, ro);
  if (!runner.ok()) return Fail(runner.status().ToString());
  auto result = planner::ProfileRunner(**runner, po);
  if (!result.ok()) return Fail(result.status().ToString());
  const std::string name = std::filesystem::path(f.model).filename().string();
  const std::string device = "cpu, " + std::to_string(f.threads) + " thread(s) of " +
                             std::to_string(std::thread::hardware_concurrency());
  std::printf("%s on %s (%s, page size %d, matmul %s)\n%s", name.c_str(), device.c_str(),
              f.kv_layout.c_str(), f.page_size, f.matmul.c_str(),
              planner::FormatProfile(*result).c_str());
  if (!f.out.empty()) {
    const std::string json = planner::ProfileToJson(*result, name, device, f.threads);
    if (Status s = WriteStringToFile(f.out, json); !s.ok()) return Fail(s.ToString());
    std::printf("wrote %s\n", f.out.c_str());
  }
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(
    profile, "Time the engine's steps and fit the planner's latency model", [](CLI::App* app) {
      auto f = std::make_shared<ProfileFlags>();
      app->add_option("--model", f->model, "model directory")->required();
      app->add_option("--threads", f->threads, "compute threads (as serve)")->capture_default_str();
      app->add_option("--out", f->out, "write the latency-model JSON here");
      app->add_flag("--quick", f->quick, "a shorter sweep (fewer shapes, repeats)");
      app->add_option("--page-size", f->page_size, "KV page size (as serve)")
          ->capture_default_str();
      app->add_option("--kv-layout", f->kv_layout, "hnd | nhd (as serve)")->capture_default_str();
      app->add_option("--matmul", f->matmul, "f32 | bf16 (as serve: profile what you deploy)")
          ->capture_default_str();
      app->add_option("--repeats", f->repeats,
                      "timed passes per shape (median); 0: the sweep's default");
      app->add_option("--decode-batches", f->decode_batches,
                      "decode shapes: these batches x --decode-contexts instead of the sweep's")
          ->delimiter(',');
      app->add_option("--decode-contexts", f->decode_contexts,
                      "decode shapes: these contexts x --decode-batches")
          ->delimiter(',');
      return [f] { return RunProfile(*f); };
    });

}  // namespace pd::apps
