// pdserve up: a local disaggregated deployment (deploy/local_deployment.h). Every instance is its
// own process on this machine (the fabric over loopback), supervised and restarted when it dies,
// and the router runs in this process:
//
//   pdserve up --model models/qwen3-tiny --prefill 1 --decode 1 --port 8000
#include <cstdio>
#include <memory>
#include <string>

#include "apps/command.h"
#include "apps/idle_poll_flag.h"
#include "apps/kv_cache_dtype_flag.h"
#include "apps/matmul_flag.h"
#include "apps/routing_flags.h"
#include "deploy/local_deployment.h"

namespace pd::apps {
namespace {

struct UpFlags {
  deploy::LocalDeploymentOptions o;
  std::string on_failure = "restart";
};

int RunUp(const UpFlags& flags) {
  deploy::LocalDeploymentOptions o = flags.o;
  Status s = CheckIdlePollUs(o.idle_poll_us);
  if (s.ok()) {
    Result<deploy::OnFailure> on_failure = deploy::ParseOnFailure(flags.on_failure);
    if (on_failure.ok()) o.on_failure = *on_failure;
    s = on_failure.status();
  }
  if (s.ok()) s = deploy::RunLocalDeployment(o);
  if (s.ok()) return 0;
  std::fprintf(stderr, "up: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

PD_REGISTER_COMMAND(
    up, "Start a local disaggregated deployment (prefill + decode + router)", [](CLI::App* app) {
      auto flags = std::make_shared<UpFlags>();
      deploy::LocalDeploymentOptions* f = &flags->o;
      f->idle_poll_us = kDefaultIdlePollUs;
      app->add_option("--model", f->model, "model directory")->required();
      app->add_option("--served-model-name", f->served_model_name,
                      "model name in the API (default: --model)");
      app->add_option("--reasoning-parser", f->reasoning_parser,
                      "every instance's --reasoning-parser (see serve --help)");
      app->add_option("--tool-call-parser", f->tool_call_parser,
                      "every instance's --tool-call-parser (see serve --help)");
      app->add_option("--chat-template", f->chat_template,
                      "every instance's --chat-template (see serve --help)");
      app->add_option("--prefill", f->num_prefill, "prefill instances")->capture_default_str();
      app->add_option("--decode", f->num_decode, "decode instances")->capture_default_str();
      app->add_option("--host", f->host, "address of every instance")->capture_default_str();
      app->add_option("--port", f->port, "router port (instances: P+1...)")->capture_default_str();
      app->add_option("--kv-layout", f->kv_layout, "hnd | nhd")->capture_default_str();
      AddKvCacheDTypeFlag(app, &f->kv_cache_dtype,
                          "every instance's --kv-cache-dtype (see serve --help)");
      app->add_option("--page-size", f->page_size, "KV page size in tokens")->capture_default_str();
      app->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", f->enable_prefix_caching,
                    "every instance's --enable-prefix-caching (see serve --help; on by default)");
      AddMatmulFlag(app, &f->matmul, "every instance's --matmul (see serve --help)");
      app->add_option("--speculative-config", f->speculative_config,
                      "every instance's --speculative-config (see serve --help)");
      app->add_option("--threads", f->threads, "compute threads per instance")
          ->capture_default_str();
      app->add_option("--prefill-tp", f->prefill_tp,
                      "tensor-parallel ranks of each prefill instance (--threads each)")
          ->check(CLI::Range(1, 64))
          ->capture_default_str();
      app->add_option("--decode-tp", f->decode_tp,
                      "tensor-parallel ranks of each decode instance (--threads each)")
          ->check(CLI::Range(1, 64))
          ->capture_default_str();
      app->add_option("--prefill-dp", f->prefill_dp,
                      "data-parallel ranks of each prefill instance (MLA models; --threads "
                      "each): each prompt is computed by the least loaded rank, its KV sent "
                      "from that rank's pages")
          ->check(CLI::Range(1, 64))
          ->capture_default_str();
      app->add_option("--decode-dp", f->decode_dp,
                      "data-parallel ranks of each decode instance (MLA models; --threads each): "
                      "each request goes to the least loaded rank, its KV written into that "
                      "rank's pages only")
          ->check(CLI::Range(1, 64))
          ->capture_default_str();
      app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens,
                      "tokens per engine step")
          ->capture_default_str();
      app->add_option("--max-num-seqs", f->max_num_seqs, "sequences per instance")
          ->capture_default_str();
      app->add_option("--max-pending-requests", f->max_pending_requests,
                      "queued + running requests per instance; beyond it 429")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
      AddRoutingFlags(app, &f->routing, &f->kv);
      app->add_option("--max-open-streams", f->max_open_streams,
                      "requests the router relays at once (streamed or not); beyond it 429")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
      app->add_option("--max-model-len", f->max_model_len, "prompt + output");
      app->add_option("--kv-cache-bytes", f->kv_cache_bytes, "per instance");
      app->add_option("--cluster-secret-file", f->cluster_secret_file,
                      "shared secret (default: a fresh random one)");
      app->add_option("--kv-transfer-timeout-ms", f->kv_transfer_timeout_ms,
                      "deadline of one KV transfer attempt")
          ->capture_default_str();
      app->add_option("--kv-prefill-wait-s", f->kv_prefill_wait_s,
                      "how long a decode instance's request waits for a prefill instance to come "
                      "back when none can take it (0: fail at once)")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
      app->add_flag("--kv-checksum", f->kv_checksum,
                    "every prefill and decode instance sends and checks a CRC32C per layer of the "
                    "KV it moves (serve --kv-checksum)");
      app->add_option("--trace", f->trace,
                      "Chrome trace-event JSON per instance: FILE with the instance's name "
                      "inserted before the extension (t.json -> t.prefill0.json)");
      app->add_option("--trace-max-events", f->trace_max_events,
                      "each --trace file keeps this many events (the first ones) and counts the "
                      "rest as dropped (its otherData.dropped_events)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
          ->capture_default_str();
      app->add_flag("--pin-whole-instances", f->pin_whole,
                    "--pin-cores, and every thread of instance k on CPU k, HTTP, fabric and KV "
                    "messenger threads too (better for mixed load on few cores; see README)");
      app->add_flag("--pin-cores", f->pin_cores,
                    "pin instance k's model threads to CPU k, and every instance's HTTP, fabric "
                    "and KV messenger threads (and the router) to --io-cpus");
      app->add_option("--kv-wait-warm-ms", f->kv_wait_warm_ms,
                      "decode instances' cache-warming period while they wait for KV (serve "
                      "--kv-wait-warm-ms); 0: off")
          ->capture_default_str();
      app->add_option("--local-prefill-max-tokens", f->local_prefill_max_tokens,
                      "decode instances compute a prompt whose uncached part is at most this "
                      "many tokens themselves, no prefill instance involved (serve "
                      "--local-prefill-max-tokens; the default is where the co-running decodes' "
                      "TPOT stays flat, docs/prefix-caching.md); -1: send every prompt with an "
                      "uncached part to a prefill instance")
          ->check(CLI::Range(-1, 1 << 30))
          ->capture_default_str();
      app->add_option("--idle-poll-us", f->idle_poll_us,
                      "every instance's --idle-poll-us: an engine loop on a core of its own (with "
                      "--pin-cores, the prefill instances') polls this long for work before it "
                      "sleeps; 0: off")
          ->capture_default_str();
      app->add_option("--io-cpus", f->io_cpus,
                      "with --pin-cores: CPUs of the HTTP, fabric, KV messenger and router "
                      "threads: auto (the CPUs no prefill instance computes on; none left: any), "
                      "any, or a list such as 1,3")
          ->capture_default_str();
      app->add_option("--fabric-provider", f->fabric_provider,
                      "libfabric provider of the KV transfers (tcp;ofi_rxm over loopback; shm: "
                      "one host, copied by the kernel between the processes)")
          ->capture_default_str();
      app->add_option("--fabric-nics", f->fabric_nics,
                      "prefill and decode instances' --fabric-nics (auto or a list of local "
                      "addresses or provider domain names): KV writes stripe over those NICs")
          ->capture_default_str();
      app->add_option("--plan", f->plan,
                      "a plan JSON from `pdserve plan --out`: its prefill/decode counts and "
                      "threads replace --prefill/--decode/--threads");
      app->add_option("--start-timeout-s", f->start_timeout_s,
                      "how long an instance may take to start (or to restart)")
          ->capture_default_str();
      app->add_option("--on-failure", flags->on_failure,
                      "when an instance dies: restart it (with backoff: 0.5 s, doubling up to "
                      "30 s; after --max-restarts failures in a row, each within 30 s of "
                      "becoming healthy, give up and stop) or stop every instance")
          ->check(CLI::IsMember({"restart", "stop"}))
          ->capture_default_str();
      app->add_option("--max-restarts", f->restart.max_failures_in_a_row,
                      "--on-failure restart: failures in a row of one instance before up gives up")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
      app->add_option("--drain-timeout-s", f->drain_timeout_s,
                      "on SIGTERM: the router refuses new requests (503 with Retry-After) and lets "
                      "those open finish for at most this long; then every instance drains "
                      "(serve --drain-timeout-s). SIGINT stops at once")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
      app->add_flag("--dry-run", f->dry_run,
                    "check the flags (and the model's config.json and --plan file) and exit");
      return [flags] { return RunUp(*flags); };
    });

}  // namespace pd::apps
