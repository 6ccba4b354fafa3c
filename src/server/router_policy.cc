// The router's routing policies beside least-loaded (router.cc): round-robin and kv-aware.
#include <algorithm>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>

#include "server/kv_choice.h"
#include "server/openai_protocol.h"
#include "server/prompt_tokens.h"
#include "server/router.h"

namespace pd::server {
namespace {

constexpr int64_t kRefusedNs = 1'000'000'000;  // as PickAvailable: refused within the last second

bool RefusedLately(const UpstreamTarget* b, int64_t now) {
  const int64_t refused = b->refused_at_ns.load();
  return refused >= 0 && now - refused < kRefusedNs;
}

int64_t NowNs() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

// The prompt's token ids as the instances compute them; empty when the request does not parse
// (the instance answers the error).
std::vector<int32_t> RequestPrompt(const httplib::Request& req, const model::Tokenizer& tokenizer) {
  ProtocolLimits limits;
  limits.max_model_len = 1 << 30;  // the instance checks the lengths, the ids and the logprobs
  limits.vocab_size = std::numeric_limits<int>::max();
  limits.max_logprobs = std::numeric_limits<int>::max();
  try {
    const auto j = nlohmann::json::parse(req.body);
    if (!j.is_object()) return {};
    auto model = j.find("model");  // the instance checks the name
    if (model != j.end() && model->is_string())
      limits.served_model_name = model->get<std::string>();
  } catch (const std::exception&) {
    return {};
  }
  const ApiKind kind = req.path == "/v1/chat/completions" ? ApiKind::kChat : ApiKind::kCompletion;
  auto parsed = ParseGenerateRequest(kind, req.body, limits);
  if (!parsed.ok()) return {};
  auto ids = PromptTokens(tokenizer, *parsed);
  return ids.ok() ? *std::move(ids) : std::vector<int32_t>();
}

}  // namespace

std::string_view RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      return "round-robin";
    case RoutingPolicy::kLeastLoaded:
      return "least-loaded";
    case RoutingPolicy::kKvAware:
      return "kv-aware";
  }
  return "?";
}

Result<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  for (RoutingPolicy p :
       {RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastLoaded, RoutingPolicy::kKvAware}) {
    if (name == RoutingPolicyName(p)) return p;
  }
  return InvalidArgument("unknown routing policy '" + std::string(name) +
                         "' (expected round-robin, least-loaded or kv-aware)");
}

UpstreamTarget* Router::PickRoundRobin() {
  const int64_t now = NowNs();
  MutexLock lock(&backends_mu_);
  const size_t n = backends_.size();
  const size_t start = n == 0 ? 0 : round_robin_.fetch_add(1) % n;
  for (size_t k = 0; k < n; ++k) {
    UpstreamTarget* b = backends_[(start + k) % n];
    if (!RefusedLately(b, now)) return b;
  }
  return nullptr;
}

UpstreamTarget* Router::PickKvAware(const httplib::Request& req) {
  const std::vector<int32_t> tokens = RequestPrompt(req, *options_.kv.tokenizer);
  if (tokens.size() < 2) return nullptr;
  const int64_t now = NowNs();
  MutexLock lock(&backends_mu_);
  std::vector<UpstreamTarget*> targets;
  std::vector<KvPeerLoad> peers;
  for (UpstreamTarget* b : backends_) {
    if (RefusedLately(b, now)) continue;
    targets.push_back(b);
    peers.push_back({b->url, b->outstanding.load()});
  }
  if (targets.empty()) return nullptr;
  const std::vector<KvCandidate> candidates = KvCandidatesFor(*kv_index_, tokens, peers);
  const int i = ChooseKvAware(candidates, options_.kv.compute_weight, options_.kv.load_weight,
                              round_robin_.fetch_add(1) % targets.size());
  kv_prompt_pages_.fetch_add(static_cast<uint64_t>(candidates[i].prompt_pages));
  kv_cached_pages_.fetch_add(static_cast<uint64_t>(std::max(0, candidates[i].cached_pages)));
  return targets[i];
}

std::string Router::KvMetricsText() const {
  if (kv_index_ == nullptr) return "";
  std::string out =
      "# TYPE pdserve:router_kv_prompt_pages_total counter\npdserve:router_kv_prompt_pages_total " +
      std::to_string(kv_prompt_pages_.load()) +
      "\n# TYPE pdserve:router_kv_cached_pages_total "
      "counter\npdserve:router_kv_cached_pages_total " +
      std::to_string(kv_cached_pages_.load()) +
      "\n# TYPE pdserve:router_kv_feed_failures_total counter\n"
      "pdserve:router_kv_feed_failures_total " +
      std::to_string(kv_feed_->failures()) + "\n";
  std::string synced = "# TYPE pdserve:router_kv_synced gauge\n";
  std::string pages = "# TYPE pdserve:router_kv_indexed_pages gauge\n";
  std::string snapshots = "# TYPE pdserve:router_kv_snapshots_total counter\n";
  MutexLock lock(&backends_mu_);
  for (const UpstreamTarget* b : backends_) {
    const KvBackendState s = kv_index_->State(b->url);
    const std::string label = "{backend=\"" + b->url + "\"} ";
    synced += "pdserve:router_kv_synced" + label + (s.synced ? "1\n" : "0\n");
    pages += "pdserve:router_kv_indexed_pages" + label + std::to_string(s.num_keys) + "\n";
    snapshots += "pdserve:router_kv_snapshots_total" + label + std::to_string(s.snapshots) + "\n";
  }
  return out + synced + pages + snapshots;
}

}  // namespace pd::server
