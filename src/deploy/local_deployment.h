// A local disaggregated deployment (`pdserve up`): every instance is a `pdserve serve --role`
// child process on this machine (the fabric over loopback), supervised (deploy/supervisor.h),
// and the router runs in this process:
//
//   LocalDeploymentOptions o;
//   o.binary = "/proc/self/exe";
//   o.model = "models/demo-llama";
//   o.num_prefill = 2;
//   Status s = RunLocalDeployment(o);  // until SIGINT / SIGTERM, or until supervision gives up
//
// Ports: the router on P, prefill instance i on P+1+i, decode instance j on P+1+N+j. It prints
// where everything listens (and each child's pid). A child that dies is logged with its cause and
// restarted with backoff (on_failure kRestart) while the router and the other instances keep
// serving; a restarted prefill instance is found again by the decode instances (they re-read its
// /pd/info and greet its new fabric endpoint), a restarted decode instance is used by the router
// again at the same URL. With on_failure kStop the first death stops everything.
// Children get SIGTERM if this process dies.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/trace.h"
#include "deploy/supervisor.h"
#include "engine/disagg_hooks.h"
#include "server/router.h"

namespace pd::deploy {

struct LocalDeploymentOptions {
  std::string binary = "/proc/self/exe";  // the pdserve executable the instances run
  std::string model;
  std::string served_model_name;
  std::string chat_template;     // every instance's --chat-template ("": the model's own)
  std::string reasoning_parser;  // every instance's --reasoning-parser ("": none)
  std::string tool_call_parser;  // every instance's --tool-call-parser ("": none)
  int num_prefill = 1;
  int num_decode = 1;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string kv_layout = "hnd";
  std::string kv_cache_dtype = "auto";  // every instance's --kv-cache-dtype
  std::string matmul = "f32";           // every instance's --matmul
  int page_size = 16;
  int threads = 1;     // compute threads per instance
  int prefill_tp = 1;  // --tensor-parallel-size of the prefill instances
  int decode_tp = 1;   // ... and of the decode instances
  int prefill_dp = 1;  // --data-parallel-size of the prefill instances (MLA models)
  int decode_dp = 1;   // ... and of the decode instances
  int max_num_batched_tokens = 512;
  int max_num_seqs = 64;
  int max_pending_requests = 256;  // every instance's --max-pending-requests
  int max_open_streams = server::RouterOptions().max_open_streams;  // the router's
  // The router's --routing (kv-aware: with the tokenizer of `model`) and its weights.
  std::string routing = "least-loaded";
  server::KvRoutingOptions kv;
  int max_model_len = 0;
  std::string kv_cache_bytes;
  std::string cluster_secret_file;  // "": a fresh random secret in a file removed at the end
  int kv_transfer_timeout_ms = 30000;
  double kv_prefill_wait_s = engine::kDefaultPrefillWaitS;  // decode instances'
  bool kv_checksum = false;           // every prefill and decode instance's --kv-checksum
  bool enable_prefix_caching = true;  // false: every instance's --no-enable-prefix-caching
  std::string speculative_config;     // every instance's --speculative-config ("": none)
  std::string trace;  // FILE: each instance writes FILE with its name before the extension
  int64_t trace_max_events = static_cast<int64_t>(TracerOptions{}.max_events);  // per file
  bool pin_cores = false;
  bool pin_whole = false;  // every thread of instance k on CPU k
  // With pin_cores: where every instance's (and the router's) I/O threads run: "auto" (the CPUs
  // no prefill instance computes on), "any", or a CPU list.
  std::string io_cpus = "auto";
  double kv_wait_warm_ms = 2.0;  // decode instances' --kv-wait-warm-ms
  int local_prefill_max_tokens = engine::kDefaultLocalPrefillMaxTokens;  // decode instances'
  int64_t idle_poll_us = 0;  // every instance's --idle-poll-us
  std::string fabric_provider = "tcp;ofi_rxm";
  std::string fabric_nics;         // prefill and decode instances' --fabric-nics; empty: one NIC
  double start_timeout_s = 300.0;  // how long an instance may take to start (or restart)
  std::string plan;  // a pdserve-plan-v1 file: instance counts and threads come from it
  // SIGTERM: the router refuses new requests and lets those open finish for this long, then every
  // instance gets SIGTERM (each drains as `serve --drain-timeout-s`, the same value).
  double drain_timeout_s = 30.0;
  bool dry_run = false;  // validate the options (and the plan file) and return
  OnFailure on_failure = OnFailure::kRestart;
  RestartPolicy restart;
};

// Runs the deployment until SIGINT or SIGTERM (OK: everything stopped cleanly) or until it cannot
// go on: InvalidArgument for options that are wrong (naming the flag), another error when an
// instance does not start or supervision gives up (saying which instance and how it ended).
// Blocks SIGINT, SIGTERM and SIGCHLD in the calling thread (call it before starting threads).
Status RunLocalDeployment(const LocalDeploymentOptions& options);

}  // namespace pd::deploy
