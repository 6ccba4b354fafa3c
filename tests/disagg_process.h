// Test helpers (header-only) for the disaggregation tests that run real instances: a `pdserve`
// child process with its stdout+stderr captured through a pipe, and small HTTP helpers (greedy
// completions, /metrics values, waiting on a condition with a deadline).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/subprocess.h"

namespace pd::testing {

// A child (common/subprocess.h: SIGKILLed and reaped on destruction) whose stdout and stderr
// come through a pipe.
class Process {
 public:
  Process() = default;
  ~Process() {
    if (fd_ >= 0) close(fd_);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool Start(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    SubprocessOptions o;
    o.argv = argv;
    o.stdout_fd = fds[1];
    o.stderr_fd = fds[1];
    Result<Subprocess> p = Subprocess::Spawn(o);
    close(fds[1]);
    if (!p.ok()) {
      close(fds[0]);
      output_ = p.status().ToString();
      return false;
    }
    process_ = std::move(p).value();
    fd_ = fds[0];
    return true;
  }

  // Reads until a line contains `needle`; returns that line ("" on timeout or exit).
  std::string WaitForLine(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      size_t pos = output_.find(needle, scanned_);
      if (pos != std::string::npos) {
        size_t b = output_.rfind('\n', pos);
        b = b == std::string::npos ? 0 : b + 1;
        size_t e = output_.find('\n', pos);
        if (e != std::string::npos) {
          scanned_ = e;
          return output_.substr(b, e - b);
        }
      }
      if (std::chrono::steady_clock::now() > end) return "";
      if (!Drain(50) && !Running()) {
        Drain(0);
        if (output_.find(needle, scanned_) == std::string::npos) return "";
      }
    }
  }

  // Waits for exit; the exit code, 128+signal when killed, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (Running()) {
      if (std::chrono::steady_clock::now() > end) return -1;
      Drain(20);
    }
    Drain(0);
    const std::optional<ExitStatus>& s = process_.exit_status();
    if (!s.has_value()) return -1;
    return s->signal != 0 ? 128 + s->signal : s->code;
  }
  int Stop(int sig, std::chrono::milliseconds timeout) {
    if (Running()) (void)process_.Signal(sig);
    return Wait(timeout);
  }
  pid_t pid() const { return process_.pid(); }
  const std::string& output() {
    Drain(0);
    return output_;
  }

 private:
  // Reads what is there (waiting up to wait_ms); false when nothing came.
  bool Drain(int wait_ms) {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, wait_ms) <= 0) return false;
    char buf[8192];
    ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }
  // Reaps the child once it has exited.
  bool Running() {
    if (!process_.running()) return false;
    Result<std::optional<ExitStatus>> s = process_.Poll();
    return s.ok() && !s->has_value();
  }

  Subprocess process_;
  int fd_ = -1;
  std::string output_;
  size_t scanned_ = 0;
};

// ------------------------------------------------------------------ helpers

// Polls `cond` every 5 ms until it holds (true) or `timeout` passes (false).
inline bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A path in the temp directory unique to this test process.
inline std::string TempPathFor(const std::string& prefix, const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (prefix + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Removes what TempPathFor(prefix, ...) created in this process (models, secret files).
inline void RemoveTempPathsFor(const std::string& prefix) {
  const std::string start = prefix + std::to_string(::getpid()) + "_";
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::temp_directory_path(), ec)) {
    if (e.path().filename().string().rfind(start, 0) == 0)
      std::filesystem::remove_all(e.path(), ec);
  }
}

// A test environment that removes what TempPathFor(prefix, ...) created when the binary ends:
// ::testing::AddGlobalTestEnvironment(new TempPathCleanup("pdserve_x_")).
class TempPathCleanup : public ::testing::Environment {
 public:
  explicit TempPathCleanup(std::string prefix) : prefix_(std::move(prefix)) {}
  void TearDown() override { RemoveTempPathsFor(prefix_); }

 private:
  std::string prefix_;
};

// The sum of every sample of metric `name` on host:port/metrics whose labels contain `labels`
// (e.g. "role=\"prefill\""; empty: every sample). -1 when /metrics does not answer or has no such
// sample.
inline double MetricSum(const std::string& host, int port, const std::string& name,
                        const std::string& labels = "") {
  httplib::Client c(host, port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(5, 0);
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  double sum = 0;
  bool found = false;
  size_t pos = 0;
  while (pos < r->body.size()) {
    size_t end = r->body.find('\n', pos);
    if (end == std::string::npos) end = r->body.size();
    const std::string line = r->body.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#' || line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    if (!labels.empty() && line.substr(0, sp).find(labels) == std::string::npos) continue;
    sum += std::atof(line.c_str() + sp + 1);
    found = true;
  }
  return found ? sum : -1;
}

// A greedy completion of a token-id prompt, with each token's logprob when `logprobs`; (HTTP
// status or -1 without an answer, body JSON).
inline std::pair<int, nlohmann::json> CompleteAt(const std::string& host, int port,
                                                 const std::vector<int>& prompt, int max_tokens,
                                                 int read_timeout_s = 120, bool logprobs = false) {
  httplib::Client c(host, port);
  c.set_read_timeout(read_timeout_s, 0);
  nlohmann::json req = {{"model", "m"},
                        {"prompt", prompt},
                        {"max_tokens", max_tokens},
                        {"temperature", 0.0},
                        {"ignore_eos", true}};
  if (logprobs) req["logprobs"] = 0;
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  if (!r) return {-1, nlohmann::json()};
  return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
}

// A TP 1 instance's logprobs against a TP, data-parallel or disaggregated one's: the sums run in
// another order, so they agree to float rounding, not bit for bit.
constexpr double kLogprobTolerance = 1e-4;

// With a bfloat16 KV cache the two instances round K and V computed in another order to bf16 (8
// significant bits), and a value that rounds the other way moves a logprob by about 1e-4.
constexpr double kBf16KvLogprobTolerance = 1e-3;

// Expects a greedy completion's first choice (`got`, asked with logprobs) to equal `want`'s:
// the text and the tokens exactly, each token's logprob within `tolerance`. Returns the largest
// logprob difference.
inline double ExpectSameGreedyChoice(const nlohmann::json& got, const nlohmann::json& want,
                                     double tolerance = kLogprobTolerance) {
  const nlohmann::json& g = got["choices"][0];
  const nlohmann::json& w = want["choices"][0];
  EXPECT_EQ(g["text"], w["text"]);
  EXPECT_EQ(g["logprobs"]["tokens"], w["logprobs"]["tokens"]);
  const nlohmann::json& gl = g["logprobs"]["token_logprobs"];
  const nlohmann::json& wl = w["logprobs"]["token_logprobs"];
  EXPECT_TRUE(gl.is_array() && wl.is_array() && gl.size() == wl.size() && !gl.empty())
      << "logprobs: got " << gl.dump() << ", want " << wl.dump();
  double max_diff = 0;
  if (!gl.is_array() || !wl.is_array()) return max_diff;
  for (size_t k = 0; k < std::min(gl.size(), wl.size()); ++k) {
    const double diff = std::abs(gl[k].get<double>() - wl[k].get<double>());
    EXPECT_LE(diff, tolerance) << "token " << k << ": " << gl[k] << " vs " << wl[k];
    max_diff = std::max(max_diff, diff);
  }
  return max_diff;
}

// One streaming greedy completion that the client abandons: after `chunks` SSE chunks, or
// (chunks == 0) when no byte arrived for `timeout_ms` (so also while the prompt is in prefill).
inline void AbandonStream(const std::string& host, int port, const std::vector<int>& prompt,
                          int max_tokens, int chunks, int timeout_ms) {
  httplib::Client c(host, port);
  if (chunks == 0) c.set_read_timeout(0, timeout_ms * 1000);
  nlohmann::json req = {{"model", "m"},       {"prompt", prompt},   {"max_tokens", max_tokens},
                        {"temperature", 0.0}, {"ignore_eos", true}, {"stream", true}};
  httplib::Request r;
  r.method = "POST";
  r.path = "/v1/completions";
  r.body = req.dump();
  r.headers.emplace("Content-Type", "application/json");
  int seen = 0;
  r.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return chunks == 0 || ++seen < chunks;
  };
  httplib::Response res;
  httplib::Error err;
  c.send(r, res, err);
}

// ------------------------------------------------------------------ deployments

// True when nothing listens on or is bound to 127.0.0.1:port right now.
inline bool PortIsFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// The lowest port the kernel hands out for outgoing connections and fabric endpoints
// (/proc/sys/net/ipv4/ip_local_port_range; 32768 by default). Ports picked at or above it can be
// taken at any moment by another test's connections.
inline int EphemeralPortLow() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  f >> low;
  return low > 1024 ? low : 32768;
}

// One deployment's block of 10 ports, base + 10 * k for k < blocks drawn from `rng`, below the
// ephemeral range and with all 10 ports free when picked; the instances take base + 10*k + 0..9.
inline int PickPortBlock(std::mt19937& rng, int base, int blocks = 3000) {
  const int span = std::max(1, std::min(blocks, (EphemeralPortLow() - 10 - base) / 10));
  int port = base;
  for (int attempt = 0; attempt < 100; ++attempt) {
    port = base + static_cast<int>(rng() % static_cast<unsigned>(span)) * 10;
    bool free = true;
    for (int p = port; p < port + 10 && free; ++p) free = PortIsFree(p);
    if (free) break;
  }
  return port;
}

// Writes a random qwen3 model of `preset` (e.g. "tiny", "small") with `seed` into `dir` through
// `binary make-model` (a test failure when it fails); returns dir.
inline std::string MakeModel(const std::string& binary, const std::string& preset, int seed,
                             const std::string& dir, const std::string& arch = "qwen3") {
  Process p;
  EXPECT_TRUE(p.Start({binary, "make-model", "--arch", arch, "--preset", preset, "--seed",
                       std::to_string(seed), "--out", dir}));
  EXPECT_EQ(p.Wait(std::chrono::seconds(120)), 0) << p.output();
  return dir;
}

// Writes `contents` (e.g. a cluster secret) to `path`; returns path.
inline std::string WriteTempFile(const std::string& path, const std::string& contents) {
  std::ofstream(path) << contents;
  return path;
}

// argv of `binary serve --model model --port port --threads 1 --max-model-len max_model_len
// --served-model-name m`, then `extra`.
inline std::vector<std::string> ServeArgv(const std::string& binary, const std::string& model,
                                          int port, int max_model_len,
                                          const std::vector<std::string>& extra) {
  std::vector<std::string> a = {binary,
                                "serve",
                                "--model",
                                model,
                                "--port",
                                std::to_string(port),
                                "--threads",
                                "1",
                                "--max-model-len",
                                std::to_string(max_model_len),
                                "--served-model-name",
                                "m"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A decode instance's (and up's) flags that send every prompt's KV over the wire, however short:
// by default a decode instance computes an uncached part of up to 64 tokens itself (conditional
// disaggregation), and the tests of the transfer use short prompts.
inline const std::vector<std::string> kTransferEveryPrompt = {"--local-prefill-max-tokens", "-1"};

// argv of `binary up --model model --prefill num_prefill --decode num_decode --port port`, then
// `extra`, then kTransferEveryPrompt unless `extra` sets --local-prefill-max-tokens.
inline std::vector<std::string> UpArgv(const std::string& binary, const std::string& model,
                                       int num_prefill, int num_decode, int port,
                                       const std::vector<std::string>& extra) {
  std::vector<std::string> a = {binary,      "up",
                                "--model",   model,
                                "--prefill", std::to_string(num_prefill),
                                "--decode",  std::to_string(num_decode),
                                "--port",    std::to_string(port)};
  a.insert(a.end(), extra.begin(), extra.end());
  if (std::find(extra.begin(), extra.end(), kTransferEveryPrompt[0]) == extra.end())
    a.insert(a.end(), kTransferEveryPrompt.begin(), kTransferEveryPrompt.end());
  return a;
}

// The engine-shape flags of `serve`/`up`: KV layout ("hnd" | "nhd"), page size, and the prefill
// token budget per step (max-num-batched-tokens; max-num-seqs is min(8, budget)).
inline std::vector<std::string> ShapeArgs(const std::string& layout, int page_size, int budget) {
  return {"--kv-layout",
          layout,
          "--page-size",
          std::to_string(page_size),
          "--max-num-batched-tokens",
          std::to_string(budget),
          "--max-num-seqs",
          std::to_string(std::min(8, budget))};
}

// Starts `argv` in `p` and reads its output until a line contains `ready` (e.g. "prefill
// instance on", "router (OpenAI API) on"); the failure carries the output so far.
inline ::testing::AssertionResult StartAndWaitFor(Process& p, const std::vector<std::string>& argv,
                                                  const std::string& ready,
                                                  std::chrono::milliseconds timeout) {
  if (!p.Start(argv)) return ::testing::AssertionFailure() << "cannot start " << argv[0];
  if (p.WaitForLine(ready, timeout).empty()) {
    return ::testing::AssertionFailure() << "no line with '" << ready << "':\n" << p.output();
  }
  return ::testing::AssertionSuccess();
}

// A prompt of `len` token ids in [10, 10 + span) varying with `salt` (span: below the vocab).
inline std::vector<int> PromptOf(int len, int salt, int span = 490) {
  std::vector<int> p(len);
  for (int i = 0; i < len; ++i) p[i] = 10 + (i * 37 + salt * 11) % span;
  return p;
}

// Whether kv usage on host:port/metrics reaches 0 (every page free) within `timeout`.
inline bool PagesFreeAt(const std::string& host, int port, std::chrono::milliseconds timeout) {
  return WaitFor([&] { return MetricSum(host, port, "pdserve:kv_cache_usage_perc") == 0.0; },
                 timeout);
}

}  // namespace pd::testing
