// pdserve up: a local disaggregated deployment. Every instance is its own process on this machine
// (the fabric over loopback), and the router runs in this process:
//
//   pdserve up --model models/qwen3-tiny --prefill 1 --decode 1 --port 8000
//
// Ports: the router on P, prefill instance i on P+1+i, decode instance j on P+1+N+j. It prints
// where everything listens (and each child's pid), and stops every child on SIGINT / SIGTERM or
// as soon as one of them dies (exit 1 then). Children get SIGTERM if this process dies.
#include <fcntl.h>
#include <httplib.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/command.h"
#include "apps/idle_poll_flag.h"
#include "apps/matmul_flag.h"
#include "common/file_util.h"
#include "common/subprocess.h"
#include "common/thread_util.h"
#include "common/trace.h"
#include "planner/deployment.h"
#include "server/router.h"

namespace pd::apps {
namespace {

struct UpFlags {
  std::string model;
  std::string served_model_name;
  int num_prefill = 1;
  int num_decode = 1;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string kv_layout = "hnd";
  std::string matmul = "f32";  // every instance's --matmul
  int page_size = 16;
  int threads = 1;     // compute threads per instance
  int prefill_tp = 1;  // --tensor-parallel-size of the prefill instances
  int decode_tp = 1;   // ... and of the decode instances
  int max_num_batched_tokens = 512;
  int max_num_seqs = 64;
  int max_pending_requests = 256;  // every instance's --max-pending-requests
  int max_open_streams = server::RouterOptions().max_open_streams;  // the router's
  int max_model_len = 0;
  std::string kv_cache_bytes;
  std::string cluster_secret_file;
  int kv_transfer_timeout_ms = 30000;
  bool kv_checksum = false;  // every prefill and decode instance's --kv-checksum
  std::string trace;  // --trace FILE: each instance writes FILE with its name before the extension
  int64_t trace_max_events = static_cast<int64_t>(TracerOptions{}.max_events);  // per file
  bool pin_cores = false;
  bool pin_whole = false;  // --pin-whole-instances: every thread of instance k on CPU k
  // --pin-cores: where every instance's (and the router's) I/O threads run: "auto" (the CPUs no
  // prefill instance computes on), "any", or a CPU list.
  std::string io_cpus = "auto";
  double kv_wait_warm_ms = 2.0;               // decode instances' --kv-wait-warm-ms
  int64_t idle_poll_us = kDefaultIdlePollUs;  // every instance's --idle-poll-us
  std::string fabric_provider = "tcp;ofi_rxm";
  double start_timeout_s = 300.0;
  std::string plan;  // a pdserve-plan-v1 file: instance counts and threads come from it
};

struct Child {
  std::string name;
  std::string url;
  Subprocess process;
  std::string trace_file;  // its --trace file, if any
};

// This binary again with `args` (args[0] its name), dying with this process; `cpu` >= 0: the child
// and every thread it starts run on that CPU only.
Result<Subprocess> Spawn(const std::vector<std::string>& args, int cpu) {
  SubprocessOptions o;
  o.path = "/proc/self/exe";
  o.argv = args;
  o.die_with_parent = true;
  if (cpu >= 0) o.cpus = {cpu};
  return Subprocess::Spawn(o);
}

std::vector<std::string> ServeArgs(const UpFlags& f, const std::string& secret_file, int port) {
  std::vector<std::string> a = {
      "pdserve", "serve", "--model", f.model, "--host", f.host, "--port", std::to_string(port),
      "--kv-layout", f.kv_layout, "--page-size", std::to_string(f.page_size), "--threads",
      std::to_string(f.threads), "--max-num-batched-tokens",
      std::to_string(f.max_num_batched_tokens), "--max-num-seqs", std::to_string(f.max_num_seqs),
      "--max-pending-requests", std::to_string(f.max_pending_requests), "--cluster-secret-file",
      secret_file, "--fabric-provider", f.fabric_provider, "--fabric-node",
      // shm names each endpoint after its node: let it pick one each
      f.fabric_provider == "shm" ? "" : f.host, "--kv-transfer-timeout-ms",
      std::to_string(f.kv_transfer_timeout_ms), "--idle-poll-us", std::to_string(f.idle_poll_us),
      "--matmul", f.matmul};
  if (!f.served_model_name.empty()) {
    a.insert(a.end(), {"--served-model-name", f.served_model_name});
  }
  if (f.max_model_len > 0) {
    a.insert(a.end(), {"--max-model-len", std::to_string(f.max_model_len)});
  }
  if (!f.kv_cache_bytes.empty()) a.insert(a.end(), {"--kv-cache-bytes", f.kv_cache_bytes});
  if (f.kv_checksum) a.push_back("--kv-checksum");
  return a;
}

// The CPUs of every instance's HTTP, fabric and KV messenger threads and of the router ("": not
// pinned). With --pin-cores and --io-cpus auto: the CPUs no prefill instance computes on, so the
// KV writes (copied by the CPU through the TCP stack over loopback) and the decode side's receives
// do not take cycles from a prefill's compute; none left: not pinned.
std::string IoCpus(const UpFlags& f) {
  if (!f.pin_cores || f.pin_whole || f.io_cpus == "any") return "";
  if (f.io_cpus != "auto") return f.io_cpus;
  const int ncpu = static_cast<int>(std::thread::hardware_concurrency());
  std::string list;
  for (int c = f.num_prefill; c < ncpu; ++c) list += (list.empty() ? "" : ",") + std::to_string(c);
  return list;
}

// Reaps children that exited; returns the first one found dead (or nullptr).
Child* ReapDead(std::vector<Child>& children) {
  for (Child& c : children) {
    if (!c.process.running()) continue;
    Result<std::optional<ExitStatus>> status = c.process.Poll();
    if (!status.ok() || status->has_value()) return &c;
  }
  return nullptr;
}

// How a child that ReapDead returned ended.
std::string DescribeExit(const Child& c) {
  const std::optional<ExitStatus>& status = c.process.exit_status();
  return status.has_value() ? status->ToString() : "cannot be waited for";
}

// SIGTERM to every child, then up to 10 s (together) for them to exit before a SIGKILL.
void StopAll(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.process.running()) (void)c.process.Signal(SIGTERM);
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (Child& c : children) {
    if (!c.process.running()) continue;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        std::max(end - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(0)));
    if (!c.process.Wait(left).ok()) (void)c.process.Kill();
  }
}

// Waits for GET url/health == 200 while the children live.
bool WaitHealthy(Child& c, std::vector<Child>& children, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (Child* dead = ReapDead(children)) {
      std::fprintf(stderr, "up: %s (pid %d) %s during start-up\n", dead->name.c_str(),
                   dead->process.pid(), DescribeExit(*dead).c_str());
      return false;
    }
    httplib::Client client(c.url);
    client.set_connection_timeout(1, 0);
    auto res = client.Get("/health");
    if (res && res->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "up: %s did not become healthy within %.0f s\n", c.name.c_str(), timeout_s);
  return false;
}

std::string WriteSecretFile() {
  char path[] = "/tmp/pdserve-secret-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return "";
  std::random_device rd;
  std::string secret;
  for (int i = 0; i < 32; ++i) secret += "0123456789abcdef"[rd() % 16];
  bool ok = write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size());
  close(fd);
  return ok ? std::string(path) : "";
}

// up passes --tensor-parallel-size (--prefill-tp / --decode-tp) to every serve: a plan's TP
// degrees go there. false refuses plans with TP > 1.
constexpr bool kServeHasTensorParallel = true;

// Takes the instance counts and threads of --plan into `f`; prints why not and returns false.
bool ApplyPlan(UpFlags* f) {
  auto text = ReadFileToString(f->plan);
  if (!text.ok()) {
    std::fprintf(stderr, "up: --plan: %s\n", text.status().ToString().c_str());
    return false;
  }
  planner::LocalLimits limits;
  limits.cores = static_cast<int>(std::thread::hardware_concurrency());
  limits.engine_tp = kServeHasTensorParallel;
  limits.pin_cores = f->pin_cores || f->pin_whole;
  auto plan = planner::LocalPlanFromJson(*text, f->plan, limits);
  if (!plan.ok()) {
    std::fprintf(stderr, "up: --plan: %s\n", plan.status().message().c_str());
    return false;
  }
  f->num_prefill = plan->num_prefill;
  f->num_decode = plan->num_decode;
  f->prefill_tp = plan->prefill_tp;
  f->decode_tp = plan->decode_tp;
  if (plan->threads > 0) f->threads = plan->threads;
  std::printf(
      "pdserve up: plan %s: %d prefill (TP %d) + %d decode (TP %d) instances, %d thread(s) per "
      "rank\n",
      f->plan.c_str(), f->num_prefill, f->prefill_tp, f->num_decode, f->decode_tp, f->threads);
  return true;
}

// The instances `up` started and the cluster secret file they share.
struct LocalDeployment {
  explicit LocalDeployment(const UpFlags& flags) : f(flags) {}
  LocalDeployment(const LocalDeployment&) = delete;
  LocalDeployment& operator=(const LocalDeployment&) = delete;
  ~LocalDeployment() { Stop(); }

  // Stops every child and removes the secret file if up wrote it. Idempotent.
  void Stop() {
    StopAll(children);
    if (own_secret && !secret_file.empty()) unlink(secret_file.c_str());
    own_secret = false;
  }

  const UpFlags& f;
  std::string secret_file;
  bool own_secret = false;
  std::vector<Child> children;
};

// Starts one instance: `pdserve serve` with up's flags plus `extra`; its index in d.children, or
// why it could not start. --pin-cores: instance k's model threads on CPU k (serve --compute-cpus);
// its HTTP, fabric and KV messenger threads may run anywhere, as a NIC's transfers take no compute
// cycles.
// --pin-whole-instances: all of instance k on CPU k (the instances then disturb each other less,
// but each one's I/O threads take its own compute's cycles).
Result<size_t> StartInstance(LocalDeployment& d, const std::string& name, int port,
                             const std::vector<std::string>& extra) {
  const UpFlags& f = d.f;
  std::vector<std::string> args = ServeArgs(f, d.secret_file, port);
  args.insert(args.end(), extra.begin(), extra.end());
  Child c{name, "http://" + f.host + ":" + std::to_string(port), Subprocess(), ""};
  if (!f.trace.empty()) {  // "prefill 0" -> FILE.prefill0.json
    std::string tag = name;
    tag.erase(std::remove(tag.begin(), tag.end(), ' '), tag.end());
    c.trace_file = TracePathFor(f.trace, tag);
    args.insert(args.end(), {"--trace", c.trace_file, "--trace-max-events",
                             std::to_string(f.trace_max_events)});
  }
  const int ncpu = static_cast<int>(std::thread::hardware_concurrency());
  const int cpu = ncpu > 0 ? static_cast<int>(d.children.size()) % ncpu : -1;
  if ((f.pin_cores || f.pin_whole) && cpu >= 0)
    args.insert(args.end(), {"--compute-cpus", std::to_string(cpu)});
  if (const std::string io = IoCpus(f); !io.empty()) args.insert(args.end(), {"--io-cpus", io});
  Result<Subprocess> process = Spawn(args, f.pin_whole ? cpu : -1);
  if (!process.ok()) return process.status().WithContext(name);
  c.process = std::move(process).value();
  d.children.push_back(std::move(c));
  return d.children.size() - 1;
}

bool FailedStart(const Status& s) {
  std::fprintf(stderr, "up: %s\n", s.ToString().c_str());
  return false;
}

// The prefill instances, healthy, then the decode instances (which connect to them), healthy.
// Their URLs into `decode_urls`; false (after saying why) when one did not come up.
bool StartInstances(LocalDeployment& d, std::vector<std::string>* decode_urls) {
  const UpFlags& f = d.f;
  std::string prefill_urls;
  for (int i = 0; i < f.num_prefill; ++i) {
    Result<size_t> k = StartInstance(
        d, "prefill " + std::to_string(i), f.port + 1 + i,
        {"--role", "prefill", "--tensor-parallel-size", std::to_string(f.prefill_tp)});
    if (!k.ok()) return FailedStart(k.status());
    prefill_urls += (i ? "," : "") + d.children[*k].url;
  }
  for (size_t k = 0; k < d.children.size(); ++k) {
    if (!WaitHealthy(d.children[k], d.children, f.start_timeout_s)) return false;
  }
  for (int j = 0; j < f.num_decode; ++j) {
    Result<size_t> k = StartInstance(
        d, "decode " + std::to_string(j), f.port + 1 + f.num_prefill + j,
        {"--role", "decode", "--prefill-peers", prefill_urls, "--tensor-parallel-size",
         std::to_string(f.decode_tp), "--kv-wait-warm-ms", std::to_string(f.kv_wait_warm_ms)});
    if (!k.ok()) return FailedStart(k.status());
    decode_urls->push_back(d.children[*k].url);
  }
  for (size_t k = f.num_prefill; k < d.children.size(); ++k) {
    if (!WaitHealthy(d.children[k], d.children, f.start_timeout_s)) return false;
  }
  return true;
}

void PrintWhere(const LocalDeployment& d) {
  for (const Child& c : d.children) {
    std::printf("pdserve up: %s on %s (pid %d)\n", c.name.c_str(), c.url.c_str(), c.process.pid());
    if (!c.trace_file.empty()) {
      std::printf("pdserve up: %s traces to %s (written when it stops)\n", c.name.c_str(),
                  c.trace_file.c_str());
    }
  }
  std::printf("pdserve up: router (OpenAI API) on http://%s:%d\n", d.f.host.c_str(), d.f.port);
  std::fflush(stdout);
}

// Waits for SIGINT / SIGTERM (exit 0) or a child's death (exit 1).
int Supervise(LocalDeployment& d, const sigset_t& signals) {
  while (true) {
    siginfo_t info;
    timespec tick{0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&signals, &info, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::printf("pdserve up: signal %d: stopping every instance\n", sig);
      return 0;
    }
    if (Child* dead = ReapDead(d.children)) {
      std::fprintf(stderr, "pdserve up: %s (pid %d) %s: stopping every instance\n",
                   dead->name.c_str(), dead->process.pid(), DescribeExit(*dead).c_str());
      return 1;
    }
  }
}

int RunUp(const UpFlags& flags) {
  UpFlags f = flags;
  if (!f.plan.empty() && !ApplyPlan(&f)) return 2;
  if (f.num_prefill < 1 || f.num_decode < 1) {
    std::fprintf(stderr, "up: --prefill and --decode must be >= 1\n");
    return 2;
  }
  if (!(f.kv_wait_warm_ms >= 0)) {
    std::fprintf(stderr, "up: --kv-wait-warm-ms must be >= 0\n");
    return 2;
  }
  if (Status s = CheckIdlePollUs(f.idle_poll_us); !s.ok()) {
    std::fprintf(stderr, "up: %s\n", s.message().c_str());
    return 2;
  }
  auto io_cpus = ParseCpuList(IoCpus(f));
  if (!IoCpus(f).empty() && !io_cpus.ok()) {
    std::fprintf(stderr, "up: --io-cpus: %s\n", io_cpus.status().message().c_str());
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  LocalDeployment d(f);
  d.secret_file = f.cluster_secret_file;
  d.own_secret = d.secret_file.empty();
  if (d.own_secret && (d.secret_file = WriteSecretFile()).empty()) {
    std::fprintf(stderr, "up: cannot write a cluster secret file in /tmp\n");
    return 1;
  }
  std::vector<std::string> decode_urls;
  if (!StartInstances(d, &decode_urls)) return 1;
  // The router's threads (started by Create and Start) inherit the I/O CPUs.
  if (!IoCpus(f).empty()) (void)PinCurrentThread(*io_cpus);
  server::RouterOptions ro;
  ro.host = f.host;
  ro.port = f.port;
  ro.backends = decode_urls;
  ro.max_open_streams = f.max_open_streams;
  std::unique_ptr<Tracer> router_trace;  // --trace: FILE.router.json, written when up stops
  if (!f.trace.empty()) {
    TracerOptions to;
    to.process_name = "router";
    to.max_events = static_cast<size_t>(f.trace_max_events);
    router_trace = std::make_unique<Tracer>(to);
    ro.tracer = router_trace.get();
  }
  auto router = server::Router::Create(ro);
  if (!router.ok() || !(*router)->Start().ok()) {
    std::fprintf(stderr, "up: the router cannot listen on %s:%d\n", f.host.c_str(), f.port);
    return 1;
  }
  PrintWhere(d);
  int exit_code = Supervise(d, signals);
  (*router)->Stop();
  if (router_trace != nullptr) {
    const std::string path = TracePathFor(f.trace, "router");
    if (Status s = router_trace->WriteToFile(path); !s.ok()) {
      std::fprintf(stderr, "pdserve up: --trace: %s\n", s.ToString().c_str());
      exit_code = 1;
    }
  }
  d.Stop();
  std::printf("pdserve up: stopped\n");
  std::fflush(stdout);
  return exit_code;
}

}  // namespace

PD_REGISTER_COMMAND(
    up, "Start a local disaggregated deployment (prefill + decode + router)", [](CLI::App* app) {
      auto f = std::make_shared<UpFlags>();
      app->add_option("--model", f->model, "model directory")->required();
      app->add_option("--served-model-name", f->served_model_name,
                      "model name in the API (default: --model)");
      app->add_option("--prefill", f->num_prefill, "prefill instances")->capture_default_str();
      app->add_option("--decode", f->num_decode, "decode instances")->capture_default_str();
      app->add_option("--host", f->host, "address of every instance")->capture_default_str();
      app->add_option("--port", f->port, "router port (instances: P+1...)")->capture_default_str();
      app->add_option("--kv-layout", f->kv_layout, "hnd | nhd")->capture_default_str();
      app->add_option("--page-size", f->page_size, "KV page size in tokens")->capture_default_str();
      AddMatmulFlag(app, &f->matmul, "every instance's --matmul (see serve --help)");
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
      app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens,
                      "tokens per engine step")
          ->capture_default_str();
      app->add_option("--max-num-seqs", f->max_num_seqs, "sequences per instance")
          ->capture_default_str();
      app->add_option("--max-pending-requests", f->max_pending_requests,
                      "queued + running requests per instance; beyond it 429")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
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
      app->add_option("--plan", f->plan,
                      "a plan JSON from `pdserve plan --out`: its prefill/decode counts and "
                      "threads replace --prefill/--decode/--threads");
      app->add_option("--start-timeout-s", f->start_timeout_s,
                      "how long an instance may take to start")
          ->capture_default_str();
      return [f] { return RunUp(*f); };
    });

}  // namespace pd::apps
