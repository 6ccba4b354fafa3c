#include "deploy/local_deployment.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "common/thread_util.h"
#include "engine/spec_decode.h"
#include "model/config.h"
#include "planner/deployment.h"
#include "server/drain.h"

namespace pd::deploy {
namespace {

using Options = LocalDeploymentOptions;

std::vector<std::string> ServeArgs(const Options& f, const std::string& secret_file, int port) {
  std::vector<std::string> a = {
      "pdserve", "serve", "--model", f.model, "--host", f.host, "--port", std::to_string(port),
      "--kv-layout", f.kv_layout, "--kv-cache-dtype", f.kv_cache_dtype, "--page-size",
      std::to_string(f.page_size), "--threads", std::to_string(f.threads),
      "--max-num-batched-tokens", std::to_string(f.max_num_batched_tokens), "--max-num-seqs",
      std::to_string(f.max_num_seqs), "--max-pending-requests",
      std::to_string(f.max_pending_requests), "--cluster-secret-file", secret_file,
      "--fabric-provider", f.fabric_provider, "--fabric-node",
      // shm names each endpoint after its node: let it pick one each
      f.fabric_provider == "shm" ? "" : f.host, "--kv-transfer-timeout-ms",
      std::to_string(f.kv_transfer_timeout_ms), "--idle-poll-us", std::to_string(f.idle_poll_us),
      "--matmul", f.matmul, "--drain-timeout-s", std::to_string(f.drain_timeout_s),
      "--kv-prefill-wait-s", std::to_string(f.kv_prefill_wait_s)};
  if (!f.fabric_nics.empty()) a.insert(a.end(), {"--fabric-nics", f.fabric_nics});
  if (!f.served_model_name.empty()) {
    a.insert(a.end(), {"--served-model-name", f.served_model_name});
  }
  if (f.max_model_len > 0) {
    a.insert(a.end(), {"--max-model-len", std::to_string(f.max_model_len)});
  }
  if (!f.kv_cache_bytes.empty()) a.insert(a.end(), {"--kv-cache-bytes", f.kv_cache_bytes});
  if (!f.chat_template.empty()) a.insert(a.end(), {"--chat-template", f.chat_template});
  if (!f.reasoning_parser.empty()) {
    a.insert(a.end(), {"--reasoning-parser", f.reasoning_parser});
  }
  if (!f.tool_call_parser.empty()) {
    a.insert(a.end(), {"--tool-call-parser", f.tool_call_parser});
  }
  if (f.kv_checksum) a.push_back("--kv-checksum");
  if (!f.enable_prefix_caching) a.push_back("--no-enable-prefix-caching");
  if (!f.speculative_config.empty()) {
    a.insert(a.end(), {"--speculative-config", f.speculative_config});
  }
  return a;
}

// The CPUs of every instance's HTTP, fabric and KV messenger threads and of the router ("": not
// pinned). With pin_cores and io_cpus auto: the CPUs no prefill instance computes on, so the
// KV writes (copied by the CPU through the TCP stack over loopback) and the decode side's receives
// do not take cycles from a prefill's compute; none left: not pinned.
std::string IoCpus(const Options& f) {
  if (!f.pin_cores || f.pin_whole || f.io_cpus == "any") return "";
  if (f.io_cpus != "auto") return f.io_cpus;
  const int ncpu = static_cast<int>(std::thread::hardware_concurrency());
  std::string list;
  for (int c = f.num_prefill; c < ncpu; ++c) list += (list.empty() ? "" : ",") + std::to_string(c);
  return list;
}

Result<std::string> WriteSecretFile() {
  char path[] = "/tmp/pdserve-secret-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return IoError("cannot write a cluster secret file in /tmp");
  std::random_device rd;
  std::string secret;
  for (int i = 0; i < 32; ++i) secret += "0123456789abcdef"[rd() % 16];
  const bool ok = write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size());
  close(fd);
  if (!ok) {
    unlink(path);
    return IoError(std::string("cannot write the cluster secret file ") + path);
  }
  return std::string(path);
}

// `serve` takes --tensor-parallel-size: a plan's TP degrees go there.
constexpr bool kServeHasTensorParallel = true;

// Takes the instance counts and threads of options.plan into `f`.
Status ApplyPlan(Options* f) {
  Result<std::string> text = ReadFileToString(f->plan);
  if (!text.ok()) return InvalidArgument("--plan: " + text.status().ToString());
  planner::LocalLimits limits;
  limits.cores = static_cast<int>(std::thread::hardware_concurrency());
  limits.engine_tp = kServeHasTensorParallel;
  limits.pin_cores = f->pin_cores || f->pin_whole;
  auto plan = planner::LocalPlanFromJson(*text, f->plan, limits);
  if (!plan.ok()) return InvalidArgument("--plan: " + plan.status().message());
  f->num_prefill = plan->num_prefill;
  f->num_decode = plan->num_decode;
  f->prefill_tp = plan->prefill_tp;
  f->decode_tp = plan->decode_tp;
  if (plan->threads > 0) f->threads = plan->threads;
  std::printf(
      "pdserve up: plan %s: %d prefill (TP %d) + %d decode (TP %d) instances, %d thread(s) per "
      "rank\n",
      f->plan.c_str(), f->num_prefill, f->prefill_tp, f->num_decode, f->decode_tp, f->threads);
  return OkStatus();
}

Status Validate(const Options& f) {
  if (f.num_prefill < 1 || f.num_decode < 1) {
    return InvalidArgument("--prefill and --decode must be >= 1");
  }
  if (!(f.kv_wait_warm_ms >= 0)) return InvalidArgument("--kv-wait-warm-ms must be >= 0");
  if (const std::string io = IoCpus(f); !io.empty()) {
    if (auto cpus = ParseCpuList(io); !cpus.ok()) {
      return InvalidArgument("--io-cpus: " + cpus.status().message());
    }
  }
  if (f.restart.max_failures_in_a_row < 1) return InvalidArgument("--max-restarts must be >= 1");
  if (f.prefill_dp > 1 && f.prefill_tp > 1)
    return InvalidArgument("--prefill-dp " + std::to_string(f.prefill_dp) + " with --prefill-tp " +
                           std::to_string(f.prefill_tp) + ": use one or the other");
  if (f.decode_dp > 1 && f.decode_tp > 1)
    return InvalidArgument("--decode-dp " + std::to_string(f.decode_dp) + " with --decode-tp " +
                           std::to_string(f.decode_tp) + ": use one or the other");
  if (!(f.drain_timeout_s >= 0)) return InvalidArgument("--drain-timeout-s must be >= 0");
  if (!f.speculative_config.empty()) {
    RETURN_IF_ERROR(engine::ParseSpeculativeConfig(f.speculative_config).status());
  }
  return OkStatus();
}

void Say(const std::string& line) {
  std::fprintf(stderr, "pdserve up: %s\n", line.c_str());
  std::fflush(stderr);
}

// The children `up` supervises, the cluster secret file they share and the router.
class Deployment {
 public:
  explicit Deployment(const Options& f) : f_(f), supervisor_(MakeSupervisorOptions(f)) {}
  ~Deployment() { (void)Stop(); }
  Deployment(const Deployment&) = delete;
  Deployment& operator=(const Deployment&) = delete;

  // Everything started, or why not; Cancelled when `signals` brought SIGINT / SIGTERM first.
  Status Start(const sigset_t& signals);
  // Until SIGINT / SIGTERM in `signals` (OK) or supervision gives up.
  Status Supervise(const sigset_t& signals);
  // Stops the router (writing its trace), every child, and removes the secret file if up wrote
  // it. Idempotent; an error only when the router's trace could not be written.
  Status Stop();

 private:
  static SupervisorOptions MakeSupervisorOptions(const Options& f) {
    SupervisorOptions o;
    o.on_failure = f.on_failure;
    o.policy = f.restart;
    o.start_timeout_s = f.start_timeout_s;
    o.log = Say;
    return o;
  }
  size_t AddInstance(const std::string& name, int port, const std::vector<std::string>& extra);
  Status StartRouter();
  void PrintWhere() const;

  const Options& f_;
  Supervisor supervisor_;
  std::string secret_file_;
  bool own_secret_ = false;
  bool drain_ = false;                    // SIGTERM: the router drains before it stops
  std::vector<std::string> trace_files_;  // per child, "" without --trace
  std::vector<std::string> decode_urls_;
  std::unique_ptr<Tracer> router_trace_;
  std::unique_ptr<model::Tokenizer> router_tokenizer_;  // kv-aware: outlives router_
  std::unique_ptr<server::Router> router_;
};

// One instance: `pdserve serve` with up's flags plus `extra`. pin_cores: instance k's model
// threads on CPU k (serve --compute-cpus); its HTTP, fabric and KV messenger threads may run
// anywhere, as a NIC's transfers take no compute cycles. pin_whole: all of instance k on CPU k
// (the instances then disturb each other less, but each one's I/O threads take its own compute's
// cycles).
size_t Deployment::AddInstance(const std::string& name, int port,
                               const std::vector<std::string>& extra) {
  std::vector<std::string> args = ServeArgs(f_, secret_file_, port);
  args.insert(args.end(), extra.begin(), extra.end());
  std::string trace_file;
  if (!f_.trace.empty()) {  // "prefill 0" -> FILE.prefill0.json
    std::string tag = name;
    tag.erase(std::remove(tag.begin(), tag.end(), ' '), tag.end());
    trace_file = TracePathFor(f_.trace, tag);
    args.insert(args.end(),
                {"--trace", trace_file, "--trace-max-events", std::to_string(f_.trace_max_events)});
  }
  const int ncpu = static_cast<int>(std::thread::hardware_concurrency());
  const int cpu = ncpu > 0 ? static_cast<int>(supervisor_.size()) % ncpu : -1;
  if ((f_.pin_cores || f_.pin_whole) && cpu >= 0)
    args.insert(args.end(), {"--compute-cpus", std::to_string(cpu)});
  if (const std::string io = IoCpus(f_); !io.empty()) args.insert(args.end(), {"--io-cpus", io});
  ChildSpec spec;
  spec.name = name;
  spec.health_url = "http://" + f_.host + ":" + std::to_string(port);
  spec.process.path = f_.binary;
  spec.process.argv = std::move(args);
  spec.process.die_with_parent = true;
  if (f_.pin_whole && cpu >= 0) spec.process.cpus = {cpu};
  trace_files_.push_back(trace_file);
  return supervisor_.Add(std::move(spec));
}

// The prefill instances, healthy, then the decode instances (which connect to them), healthy,
// then the router in front of the decode instances.
Status Deployment::Start(const sigset_t& signals) {
  const auto interrupted = [&signals] {
    timespec now{0, 0};
    siginfo_t info;
    int sig;
    while ((sig = sigtimedwait(&signals, &info, &now)) == SIGCHLD) {
    }
    return sig == SIGINT || sig == SIGTERM;
  };
  secret_file_ = f_.cluster_secret_file;
  if (secret_file_.empty()) {
    ASSIGN_OR_RETURN(secret_file_, WriteSecretFile());
    own_secret_ = true;
  }
  std::vector<size_t> prefill, decode;
  std::string prefill_urls;
  for (int i = 0; i < f_.num_prefill; ++i) {
    prefill.push_back(
        AddInstance("prefill " + std::to_string(i), f_.port + 1 + i,
                    {"--role", "prefill", "--tensor-parallel-size", std::to_string(f_.prefill_tp),
                     "--data-parallel-size", std::to_string(f_.prefill_dp)}));
    prefill_urls += (i ? "," : "") + supervisor_.spec(prefill.back()).health_url;
  }
  std::vector<std::string> decode_args = {"--role",
                                          "decode",
                                          "--prefill-peers",
                                          prefill_urls,
                                          "--tensor-parallel-size",
                                          std::to_string(f_.decode_tp),
                                          "--data-parallel-size",
                                          std::to_string(f_.decode_dp),
                                          "--kv-wait-warm-ms",
                                          std::to_string(f_.kv_wait_warm_ms),
                                          "--local-prefill-max-tokens",
                                          std::to_string(f_.local_prefill_max_tokens)};
  if (f_.routing == "kv-aware") {  // the decode instances pick their prefill instance the same way
    decode_args.insert(decode_args.end(),
                       {"--prefill-routing", "kv-aware", "--prefill-kv-compute-weight",
                        std::to_string(f_.kv.compute_weight), "--prefill-kv-load-weight",
                        std::to_string(f_.kv.load_weight)});
  }
  for (int j = 0; j < f_.num_decode; ++j) {
    decode.push_back(
        AddInstance("decode " + std::to_string(j), f_.port + 1 + f_.num_prefill + j, decode_args));
    decode_urls_.push_back(supervisor_.spec(decode.back()).health_url);
  }
  for (size_t k : prefill) RETURN_IF_ERROR(supervisor_.Start(k));
  RETURN_IF_ERROR(supervisor_.WaitHealthy(prefill, f_.start_timeout_s, interrupted));
  for (size_t k : decode) RETURN_IF_ERROR(supervisor_.Start(k));
  RETURN_IF_ERROR(supervisor_.WaitHealthy(decode, f_.start_timeout_s, interrupted));
  RETURN_IF_ERROR(StartRouter());
  PrintWhere();
  return OkStatus();
}

Status Deployment::StartRouter() {
  // The router's threads (started by Create and Start) inherit the I/O CPUs.
  if (const std::string io = IoCpus(f_); !io.empty()) {
    ASSIGN_OR_RETURN(std::vector<int> cpus, ParseCpuList(io));
    (void)PinCurrentThread(cpus);
  }
  server::RouterOptions ro;
  ro.host = f_.host;
  ro.port = f_.port;
  ro.backends = decode_urls_;
  ro.max_open_streams = f_.max_open_streams;
  ASSIGN_OR_RETURN(ro.routing, server::ParseRoutingPolicy(f_.routing));
  ro.kv = f_.kv;
  if (ro.routing == server::RoutingPolicy::kKvAware) {
    auto tokenizer = model::Tokenizer::Load(f_.model, f_.chat_template);
    if (!tokenizer.ok()) return tokenizer.status().WithContext("router --routing kv-aware");
    router_tokenizer_ = std::move(tokenizer).value();
    ro.kv.tokenizer = router_tokenizer_.get();
  }
  if (!f_.trace.empty()) {  // FILE.router.json, written when up stops
    TracerOptions to;
    to.process_name = "router";
    to.max_events = static_cast<size_t>(f_.trace_max_events);
    router_trace_ = std::make_unique<Tracer>(to);
    ro.tracer = router_trace_.get();
  }
  auto router = server::Router::Create(ro);
  if (!router.ok()) return router.status().WithContext("router");
  router_ = std::move(router).value();
  if (Status s = router_->Start(); !s.ok()) {
    return Unavailable("the router cannot listen on " + f_.host + ":" + std::to_string(f_.port) +
                       ": " + s.message());
  }
  return OkStatus();
}

void Deployment::PrintWhere() const {
  for (size_t k = 0; k < supervisor_.size(); ++k) {
    const ChildSpec& c = supervisor_.spec(k);
    std::printf("pdserve up: %s on %s (pid %d)\n", c.name.c_str(), c.health_url.c_str(),
                supervisor_.pid(k));
    if (!trace_files_[k].empty()) {
      std::printf("pdserve up: %s traces to %s (written when it stops)\n", c.name.c_str(),
                  trace_files_[k].c_str());
    }
  }
  std::printf("pdserve up: router (OpenAI API) on http://%s:%d\n", f_.host.c_str(), f_.port);
  std::fflush(stdout);
}

Status Deployment::Supervise(const sigset_t& signals) {
  while (true) {
    siginfo_t info;
    timespec tick{0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, &info, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::printf("pdserve up: SIG%s: %s every instance\n", sigabbrev_np(sig),
                  sig == SIGTERM ? "draining the router, then stopping" : "stopping");
      std::fflush(stdout);
      drain_ = sig == SIGTERM;
      return OkStatus();
    }
    RETURN_IF_ERROR(supervisor_.Step());
  }
}

Status Deployment::Stop() {
  Status result;
  if (router_ != nullptr && drain_) {
    server::Router* r = router_.get();
    server::DrainHooks hooks;
    hooks.begin = [r] { r->BeginDrain(); };
    hooks.in_flight = [r] { return r->open_streams(); };
    hooks.end_running = [r](const std::string& why) { r->EndRunning(why); };
    (void)server::Drain(hooks, f_.drain_timeout_s, "up's router");
  }
  if (router_ != nullptr) router_->Stop();
  router_.reset();
  if (router_trace_ != nullptr) {
    const std::string path = TracePathFor(f_.trace, "router");
    if (Status s = router_trace_->WriteToFile(path); !s.ok()) result = s.WithContext("--trace");
    router_trace_.reset();
  }
  // Each instance drains what it still holds (little, once the router has drained).
  supervisor_.StopAll(
      std::chrono::milliseconds(10000 + static_cast<int64_t>(f_.drain_timeout_s * 1000)));
  if (own_secret_) unlink(secret_file_.c_str());
  own_secret_ = false;
  return result;
}

}  // namespace

Status RunLocalDeployment(const LocalDeploymentOptions& options) {
  Options f = options;
  if (!f.plan.empty()) RETURN_IF_ERROR(ApplyPlan(&f));
  RETURN_IF_ERROR(Validate(f));
  if (f.dry_run) {
    if (auto config = model::LoadModelConfig(f.model); !config.ok()) {
      return InvalidArgument("--model: " + config.status().ToString());
    }
    std::printf("pdserve up: --dry-run: the flags are valid (%d prefill, %d decode)\n",
                f.num_prefill, f.num_decode);
    return OkStatus();
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Deployment d(f);
  Status status = d.Start(signals);
  if (status.ok()) {
    status = d.Supervise(signals);
  } else if (status.code() == StatusCode::kCancelled) {  // Ctrl-C while starting: a clean stop
    std::printf("pdserve up: interrupted while starting: stopping every instance\n");
    status = OkStatus();
  }
  Status stopped = d.Stop();
  if (status.ok()) status = stopped;
  std::printf("pdserve up: stopped\n");
  std::fflush(stdout);
  return status;
}

}  // namespace pd::deploy
