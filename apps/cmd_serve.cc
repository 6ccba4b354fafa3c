// pdserve serve: one colocated instance behind the OpenAI-compatible HTTP API.
//
//   pdserve serve --model models/qwen3-tiny --port 8000
//
// The engine loop runs on its own thread (AsyncEngine); HTTP threads submit to it and stream
// its outputs. SIGTERM drains (server/drain.h: new requests 503, those in flight finish within
// --drain-timeout-s) and exits 0; SIGINT stops accepting, aborts what is in flight and exits 0.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "apps/command.h"
#include "apps/http_limit_flags.h"
#include "apps/idle_poll_flag.h"
#include "apps/kv_cache_dtype_flag.h"
#include "apps/matmul_flag.h"
#include "apps/serve_roles.h"  // --role prefill|decode (messenger, H9)
#include "common/file_util.h"
#include "common/log.h"
#include "common/thread_util.h"
#include "engine/async_engine.h"
#include "engine/cpu_features.h"
#include "engine/dp_engine.h"
#include "engine/engine.h"
#include "engine/idle_poll.h"
#include "engine/kv_events.h"
#include "messenger/decode_side.h"
#include "messenger/handshake.h"
#include "model/config.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "server/drain.h"
#include "server/http_server.h"
#include "server/prompt_tokens.h"

namespace pd::apps {
namespace {

// 16 HTTP threads (they read requests; one event-loop thread writes every answer) and a long
// queue of connections waiting for one.
server::HttpLimits ServeHttpLimits() {
  server::HttpLimits l;
  l.num_threads = 16;
  l.max_queued_connections = 4096;
  return l;
}

struct ServeFlags {
  std::string model;
  std::string chat_template;     // a Jinja file replacing the model's chat template
  std::string reasoning_parser;  // deepseek_r1 | qwen3 | "" (none)
  std::string tool_call_parser;  // hermes | qwen3_coder | deepseek_v3 | llama3_json | "" (none)
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  int max_model_len = 0;  // 0: the model's max_position_embeddings
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int page_size = 16;
  bool enable_prefix_caching = true;
  std::string speculative_config;  // vLLM's JSON shape (engine/spec_decode.h); "": none
  std::string kv_layout = "hnd";
  std::string kv_cache_dtype = "auto";  // apps/kv_cache_dtype_flag.h
  std::string matmul = "f32";           // engine::MatmulPrecision
  size_t kv_cache_bytes = 256ull << 20;
  int threads = 0;
  std::string compute_cpus;  // empty: every thread may run on any CPU the process may
  std::string io_cpus;       // HTTP, fabric and KV messenger threads; empty: any CPU
  int tensor_parallel_size = 1;
  int data_parallel_size = 1;  // MLA models: attention ranks, MoE experts dealt across them
  std::string api_key;
  int max_pending_requests = 256;
  int max_inflight_requests = 0;
  // Every HTTP server of the process (the OpenAI front, a prefill role's bootstrap server).
  server::HttpLimits http = ServeHttpLimits();
  bool dry_run = false;                       // --dry-run: check the flags and exit
  RoleFlags roles;                            // disaggregation roles (apps/serve_roles.h)
  int64_t idle_poll_us = kDefaultIdlePollUs;  // only with dedicated --compute-cpus
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "serve: %s\n", message.c_str());
  return 1;
}

// --trace: a tracer that outlives the engine, its file checked writable at start.
Result<std::unique_ptr<Tracer>> MakeTracer(const RoleFlags& roles, const ServeFlags& f) {
  if (roles.trace_file.empty()) return std::unique_ptr<Tracer>();
  TracerOptions to;
  to.process_name = "pdserve " + roles.role;
  to.max_events = static_cast<size_t>(roles.trace_max_events);
  auto tracer = std::make_unique<Tracer>(to);
  RETURN_IF_ERROR(tracer->WriteToFile(roles.trace_file).WithContext("--trace"));
  // What ran where, for the viewer and bench/plot.py's titles: the served model's name (its
  // last path component) and this machine's CPU.
  std::string model = f.served_model_name.empty() ? f.model : f.served_model_name;
  while (model.size() > 1 && model.back() == '/') model.pop_back();
  if (model.find('/') != std::string::npos) model = model.substr(model.find_last_of('/') + 1);
  tracer->Instant("process labels", "meta",
                  {{"model", model},
                   {"host", engine::CpuModelName() + " (" +
                                std::to_string(std::thread::hardware_concurrency()) + " CPUs)"}});
  return tracer;
}

// Writes the trace at shutdown; a write error turns exit code 0 into 1.
int FinishTrace(const Tracer* tracer, const std::string& path, int rc) {
  if (tracer == nullptr) return rc;
  if (Status s = tracer->WriteToFile(path); !s.ok()) return Fail("--trace: " + s.ToString());
  std::printf("pdserve: trace (%zu events, %llu dropped) written to %s\n", tracer->num_events(),
              static_cast<unsigned long long>(tracer->dropped()), path.c_str());
  std::fflush(stdout);
  return rc;
}

// --compute-cpus / --io-cpus (`flag`): the listed CPUs (empty when the flag is), each one this
// process may use.
Result<std::vector<int>> ParseCpusFlag(const std::string& flag, const std::string& list) {
  if (list.empty()) return std::vector<int>();
  auto cpus = ParseCpuList(list);
  if (!cpus.ok()) return InvalidArgument(flag + ": " + cpus.status().message());
  const std::vector<int> allowed = CurrentThreadCpus();
  for (int c : *cpus) {
    if (std::find(allowed.begin(), allowed.end(), c) == allowed.end())
      return InvalidArgument(flag + ": CPU " + std::to_string(c) +
                             " is not one this process may use");
  }
  return cpus;
}

// The engine's options from the flags; without --threads, --compute-cpus's CPUs are split over
// the ranks.
engine::EngineOptions MakeEngineOptions(const ServeFlags& f, engine::KvLayout layout,
                                        engine::KvDType kv_dtype, int max_model_len,
                                        const std::vector<int>& compute_cpus, Tracer* tracer) {
  engine::EngineOptions eo;
  eo.runner.tracer = tracer;
  eo.runner.kv.page_size = f.page_size;
  eo.runner.kv.layout = layout;
  eo.runner.kv.dtype = kv_dtype;
  eo.runner.kv_cache_bytes = f.kv_cache_bytes;
  eo.runner.num_threads =
      f.threads > 0 || compute_cpus.empty()
          ? f.threads
          : std::max<int>(1, static_cast<int>(compute_cpus.size()) /
                                 (f.tensor_parallel_size * f.data_parallel_size));
  eo.runner.tensor_parallel_size = f.tensor_parallel_size;
  eo.runner.matmul = CheckedMatmul(f.matmul);
  eo.scheduler.max_num_seqs = f.max_num_seqs;
  eo.scheduler.max_num_batched_tokens = f.max_num_batched_tokens;
  eo.scheduler.max_model_len = max_model_len;
  eo.scheduler.enable_prefix_caching = f.enable_prefix_caching;
  return eo;
}

server::ServerOptions MakeServerOptions(const ServeFlags& f, int max_model_len) {
  server::ServerOptions so;
  so.host = f.host;
  so.port = f.port;
  so.served_model_name = f.served_model_name.empty() ? f.model : f.served_model_name;
  so.model_path = f.model;
  so.api_key = f.api_key;
  so.max_model_len = max_model_len;
  so.max_inflight_requests = f.max_inflight_requests;
  so.http = f.http;
  return so;
}

// Blocks SIGINT and SIGTERM (returned, for sigwait) and ignores SIGPIPE.
sigset_t BlockStopSignals() {
  // Block the stop signals before any thread starts, so every thread inherits the mask and the
  // main thread receives them in sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is an error on that socket only
  return stop_signals;
}

// --dry-run: the checks that need no model loaded and no network, then exit 0, or 1 naming the
// flag that is wrong (the role flags and parsers were checked before).
int DryRun(const ServeFlags& f) {
  if (Status s = CheckIdlePollUs(f.idle_poll_us); !s.ok()) return Fail(s.message());
  for (const auto& [flag, list] :
       {std::pair{"--compute-cpus", f.compute_cpus}, std::pair{"--io-cpus", f.io_cpus}}) {
    if (auto cpus = ParseCpusFlag(flag, list); !cpus.ok()) return Fail(cpus.status().message());
  }
  auto config = model::LoadModelConfig(f.model);
  if (!config.ok()) return Fail("--model: " + config.status().ToString());
  if (f.max_model_len > config->max_position_embeddings) {
    return Fail("--max-model-len " + std::to_string(f.max_model_len) + " exceeds the model's " +
                std::to_string(config->max_position_embeddings) + " positions");
  }
  if (!f.chat_template.empty()) {
    if (auto t = ReadFileToString(f.chat_template); !t.ok()) {
      return Fail("--chat-template: " + t.status().ToString());
    }
  }
  if (f.roles.role != "colocated") {
    if (auto secret = ReadClusterSecret(f.roles); !secret.ok()) {
      return Fail(secret.status().ToString());
    }
  }
  std::printf("serve: --dry-run: the flags are valid (role %s, model %s)\n", f.roles.role.c_str(),
              f.model.c_str());
  return 0;
}

int RunServe(const ServeFlags& f) {
  const sigset_t stop_signals = BlockStopSignals();

  auto layout = engine::ParseKvLayout(f.kv_layout);
  if (!layout.ok()) return Fail("--kv-layout: " + layout.status().message());
  const engine::KvDType kv_dtype = CheckedKvCacheDType(f.kv_cache_dtype);
  // Before the model loads: a refused role (no cluster secret, ...) says so at once.
  if (Status s = ValidateRoleFlags(f.roles); !s.ok()) return Fail(s.message());
  auto reasoning_parser = server::ParseReasoningParserName(f.reasoning_parser);
  if (!reasoning_parser.ok()) return Fail(reasoning_parser.status().message());
  auto tool_call_format = server::ParseToolCallParserName(f.tool_call_parser);
  if (!tool_call_format.ok()) return Fail(tool_call_format.status().message());
  Result<engine::SpeculativeConfig> spec = engine::SpeculativeConfig{};
  if (!f.speculative_config.empty()) spec = engine::ParseSpeculativeConfig(f.speculative_config);
  if (!spec.ok()) return Fail(spec.status().message());
  if (f.dry_run) return DryRun(f);
  auto tokenizer = model::Tokenizer::Load(f.model, f.chat_template);
  if (!tokenizer.ok()) return Fail(tokenizer.status().ToString());
  auto weights = model::LoadModelWeights(f.model);
  if (!weights.ok()) return Fail(weights.status().ToString());
  const int max_model_len =
      f.max_model_len > 0 ? f.max_model_len : weights->config.max_position_embeddings;
  auto tracer = MakeTracer(f.roles, f);
  if (!tracer.ok()) return Fail(tracer.status().ToString());
  RoleFlags roles = f.roles;
  roles.tracer = tracer->get();
  roles.tensor_parallel_size = f.tensor_parallel_size;

  auto cpus = ParseCpusFlag("--compute-cpus", f.compute_cpus);
  if (!cpus.ok()) return Fail(cpus.status().message());
  const std::vector<int> compute_cpus = *std::move(cpus);
  auto io = ParseCpusFlag("--io-cpus", f.io_cpus);
  if (!io.ok()) return Fail(io.status().message());
  engine::EngineOptions eo =
      MakeEngineOptions(f, *layout, kv_dtype, max_model_len, compute_cpus, roles.tracer);
  eo.model_fingerprint = messenger::ModelFingerprint(*weights);  // roots the prefix cache's keys
  engine::KvEventLog kv_events;  // the prefix cache's keys for KV-aware routers (/v1/kv_events)
  eo.kv_events = &kv_events;
  roles.kv_events = &kv_events;
  roles.api_key = f.api_key;
  roles.tokenizer_fingerprint = server::TokenizerFingerprint(**tokenizer);
  eo.speculative = *spec;
  auto draft = messenger::DraftFingerprint(*spec, eo.model_fingerprint);
  if (!draft.ok()) return Fail(draft.status().ToString());
  roles.speculative = messenger::SpeculativeIdentity(*spec, *draft);  // the handshake compares it
  WarnIfMatmulFallsBack("serve", eo.runner.matmul);
  if (kv_dtype == engine::KvDType::kFP8E4M3)
    PD_LOG_INFO("serve: fp8_e4m3 KV cache with {}", model::DescribeKvScales(weights->kv_scales));
  // --compute-cpus: the model's threads (pool workers and rank threads, started by Create, inherit
  // the main thread's affinity; the engine loop pins itself) run there; HTTP, fabric and KV
  // messenger threads, started later, on --io-cpus (default: every CPU).
  const std::vector<int> all_cpus = CurrentThreadCpus();
  if (!compute_cpus.empty()) (void)PinCurrentThread(compute_cpus);
  auto eng = f.data_parallel_size > 1 ? engine::CreateDpEngine(*weights, eo, f.data_parallel_size)
                                      : engine::Engine::Create(*weights, eo);
  if (!compute_cpus.empty() || !io->empty()) (void)PinCurrentThread(io->empty() ? all_cpus : *io);
  if (!eng.ok()) return Fail(eng.status().ToString());
  engine::AsyncEngineOptions ao;
  ao.max_pending_requests = f.max_pending_requests;
  ao.loop_cpus = compute_cpus;
  if (Status s = CheckIdlePollUs(f.idle_poll_us); !s.ok()) return Fail(s.message());
  ao.idle_poll_us = engine::ComputeCpusAreDedicated(compute_cpus, *io) ? f.idle_poll_us : 0;
  if (f.idle_poll_us > 0 && ao.idle_poll_us == 0) {
    PD_LOG_INFO(
        "serve: --idle-poll-us off: the engine loop has no CPU of its own (it needs "
        "--compute-cpus and --io-cpus without a CPU in common)");
  }
  ao.warm_period_s = f.roles.kv_wait_warm_ms / 1000.0;
  if (f.roles.role == "prefill") {
    const int rc =
        RunPrefillRole(roles, *weights, std::move(eng).value(), ao, f.host, f.port, f.http);
    return FinishTrace(roles.tracer, roles.trace_file, rc);
  }
  auto role_engine = CreateRoleEngine(roles, *weights, std::move(eng).value(), ao);
  if (!role_engine.ok()) return Fail(role_engine.status().ToString());
  std::unique_ptr<engine::AsyncEngine>* async = &role_engine->engine;

  server::ServerOptions so = MakeServerOptions(f, max_model_len);
  so.reasoning_parser = *reasoning_parser;
  so.tool_call_format = *tool_call_format;
  so.tracer = roles.tracer;
  so.kv_events = &kv_events;
  auto* decode = dynamic_cast<messenger::DecodeMessenger*>(async->get());
  if (decode != nullptr) {
    // The decode instance's KV transfer counters and histogram, and its prefill peers' states,
    // beside the serving metrics.
    so.extra_metrics = [decode, chooser = role_engine->prefill_chooser] {
      return decode->metrics().PrometheusText("decode") +
             messenger::PeersPrometheusText(decode->peers()) +
             (chooser != nullptr ? chooser->MetricsText("pdserve:prefill_kv") : "");
    };
  }
  auto server = server::OpenAiServer::Create(so, async->get(), tokenizer->get());
  if (!server.ok()) return Fail(server.status().ToString());
  if (Status s = (*server)->Start(); !s.ok()) return Fail(s.ToString());
  auto registration = RegisterRole(roles, *weights, f.host, (*server)->port(),
                                   decode != nullptr ? decode->fabric_address() : "");
  if (!registration.ok()) return Fail(registration.status().WithContext("--discovery").ToString());
  std::printf("pdserve: serving %s on http://%s:%d (max_model_len %d, max_num_seqs %d)\n",
              so.served_model_name.c_str(), f.host.c_str(), (*server)->port(), max_model_len,
              f.max_num_seqs);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  PD_LOG_INFO("serve: signal {}: shutting down", sig);
  if (sig == SIGTERM) {
    server::OpenAiServer* s = server->get();
    server::DrainHooks hooks;
    hooks.begin = [s, r = registration->get()] {
      if (r != nullptr) r->Deregister();  // the router (--discovery) looks away first
      s->BeginDrain();
    };
    hooks.in_flight = [s] { return s->inflight(); };
    hooks.end_running = [s](const std::string& why) { s->EndRunning(why); };
    (void)server::Drain(hooks, f.roles.drain_timeout_s, "serve");
  }
  if (*registration != nullptr) (*registration)->Deregister();
  (*server)->Stop();
  role_engine->prefill_watch.reset();  // before the messenger it feeds shuts down
  (*async)->Shutdown();
  std::printf("pdserve: stopped\n");
  return FinishTrace(roles.tracer, roles.trace_file, 0);
}

}  // namespace

PD_REGISTER_COMMAND(serve, "Serve a model with the OpenAI-compatible HTTP API", [](CLI::App* app) {
  auto f = std::make_shared<ServeFlags>();
  app->add_option("--model", f->model, "model directory (Hugging Face layout)")->required();
  app->add_option("--host", f->host, "address to listen on")->capture_default_str();
  app->add_option("--port", f->port, "port (0: any free port, printed at start)")
      ->capture_default_str();
  app->add_option("--served-model-name", f->served_model_name,
                  "model name in the API (default: --model)");
  app->add_option("--reasoning-parser", f->reasoning_parser,
                  "deepseek_r1 | qwen3: return a chat reply's <think> part as reasoning_content");
  app->add_option("--tool-call-parser", f->tool_call_parser,
                  "hermes | qwen3_coder | deepseek_v3 | llama3_json: return the tool calls of a "
                  "chat reply as tool_calls (and force one for tool_choice required / named)");
  app->add_option("--chat-template", f->chat_template,
                  "Jinja chat template file (default: the model's chat_template.jinja or "
                  "tokenizer_config.json's chat_template)");
  app->add_option("--max-model-len", f->max_model_len,
                  "prompt + output tokens (default: the model's)");
  app->add_option("--max-num-seqs", f->max_num_seqs, "sequences running at once")
      ->capture_default_str();
  app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens, "tokens per engine step")
      ->capture_default_str();
  app->add_option("--page-size", f->page_size, "KV page size in tokens")->capture_default_str();
  app->add_option("--kv-layout", f->kv_layout, "hnd | nhd")->capture_default_str();
  app->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", f->enable_prefix_caching,
                "keep computed full KV pages cached by their tokens and share them with later "
                "prompts that start the same way (on by default)");
  app->add_option(
      "--speculative-config", f->speculative_config,
      "speculative decoding, as a JSON object in vLLM's shape: {\"method\": "
      "\"ngram\", \"num_speculative_tokens\": K, \"prompt_lookup_min\": a, "
      "\"prompt_lookup_max\": b}; \"draft_model\" with \"model\": DIR (a checkpoint with the "
      "target's tokenizer); \"mtp\" for a deepseek_v3 checkpoint with its MTP layer");
  AddKvCacheDTypeFlag(app, &f->kv_cache_dtype, kKvCacheDTypeFlagHelp);
  AddMatmulFlag(app, &f->matmul, kMatmulFlagHelp);
  app->add_option("--kv-cache-bytes", f->kv_cache_bytes, "KV cache size in bytes")
      ->capture_default_str();
  app->add_option("--threads", f->threads, "compute threads per rank (0: all cores / ranks)")
      ->capture_default_str();
  app->add_option("--compute-cpus", f->compute_cpus,
                  "CPUs for the model's threads, e.g. 0 or 0-3 (HTTP, fabric and KV messenger "
                  "threads stay on every CPU; --threads defaults to their number / ranks)");
  app->add_option("--io-cpus", f->io_cpus,
                  "CPUs for the HTTP, fabric and KV messenger threads, e.g. 1 or 2-3 (default: "
                  "every CPU)");
  app->add_option("--tensor-parallel-size", f->tensor_parallel_size,
                  "ranks (threads) splitting heads, KV heads and MLP columns (every role: the KV "
                  "messenger moves every rank's cache by the shard plan)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app->add_option("--data-parallel-size", f->data_parallel_size,
                  "MLA models (deepseek_v3): attention ranks (threads), each with its own requests "
                  "and latent KV pages; the MoE layers run over every rank's tokens, the experts "
                  "dealt to the ranks (not with --tensor-parallel-size above 1)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app->add_option("--api-key", f->api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  app->add_option("--max-pending-requests", f->max_pending_requests,
                  "queued + running requests; beyond it requests get 429")
      ->capture_default_str();
  app->add_option("--max-inflight-requests", f->max_inflight_requests,
                  "generation requests in flight on the HTTP front; beyond it 503 (0: limited by "
                  "--max-pending-requests only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  AddHttpLimitFlags(app, &f->http);
  app->add_option("--idle-poll-us", f->idle_poll_us,
                  "when the engine loop runs out of work it polls this long for more before it "
                  "sleeps (a sleeping loop whose core has gone idle takes 70-120 us to wake on a "
                  "KVM guest); only when --compute-cpus and --io-cpus have no CPU in common, "
                  "else off; 0: off")
      ->capture_default_str();
  AddRoleFlags(app, &f->roles);
  app->add_flag("--dry-run", f->dry_run,
                "check the flags and the files they name (the model's config.json, the chat "
                "template, the cluster secret) without loading the model, then exit");
  return [f] { return RunServe(*f); };
});

}  // namespace pd::apps
