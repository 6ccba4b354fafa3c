// A test backend (header-only) that publishes a real KvEventLog at GET /v1/kv_events, for the
// KV-aware choices' tests (router_kv_test.cc, kv_choice_test.cc): the prefix cache is what the
// test puts in it; POST /v1/completions answers "{}" and is counted.
#pragma once

#include <httplib.h>

#include <atomic>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/kv_events.h"
#include "engine/prefix_cache.h"
#include "server/auth.h"
#include "server/kv_events_wire.h"

namespace pd::server::testing {

inline constexpr int kKvBackendPage = 4;          // its page size
inline constexpr uint64_t kKvBackendRoot = 1234;  // its keys' root

// A colocated instance's HTTP surface as the router sees it: completions (counted) and the KV
// events of a prefix cache the test fills.
class KvBackend {
 public:
  // api_key: required on /v1/kv_events ("": none).
  explicit KvBackend(uint64_t tokenizer_fingerprint, std::string api_key = "")
      : fingerprint_(tokenizer_fingerprint), api_key_(std::move(api_key)) {
    log_.SetFormat(kKvBackendRoot, kKvBackendPage);
    server_.Post("/v1/completions", [this](const httplib::Request&, httplib::Response& res) {
      ++completions_;
      res.set_content("{}", "application/json");
    });
    server_.Get("/v1/kv_events", [this](const httplib::Request& req, httplib::Response& res) {
      if (failing_) {
        res.status = 500;
        return;
      }
      if (!api_key_.empty() && !BearerMatches(req.get_header_value("Authorization"), api_key_)) {
        res.status = 401;
        return;
      }
      HandleKvEvents(&log_, fingerprint_.load(), req, res);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~KvBackend() {
    log_.Close();
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Caches the full pages of `tokens` (all but the last token's), as the engine would.
  void Cache(const std::vector<int32_t>& tokens) {
    std::vector<uint64_t> keys;
    const std::span<const int32_t> t(tokens);
    engine::ExtendPageKeys(kKvBackendRoot,
                           t.first((tokens.size() - 1) / kKvBackendPage * kKvBackendPage),
                           kKvBackendPage, &keys);
    for (uint64_t k : keys) log_.OnStored(k);
  }
  int completions() const { return completions_.load(); }
  void set_failing(bool f) { failing_ = f; }
  void set_fingerprint(uint64_t f) { fingerprint_ = f; }

 private:
  engine::KvEventLog log_;
  std::atomic<uint64_t> fingerprint_;
  const std::string api_key_;
  std::atomic<bool> failing_{false};
  std::atomic<int> completions_{0};
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace pd::server::testing
