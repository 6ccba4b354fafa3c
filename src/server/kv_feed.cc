#include "server/kv_feed.h"

#include <httplib.h>

#include <algorithm>

#include "common/rate_limited_log.h"
#include "server/kv_events_wire.h"

namespace pd::server {

struct KvEventFeed::Poller {
  std::string url;
  std::thread thread;
  Mutex mu;
  CondVar wake;
  bool stop GUARDED_BY(mu) = false;
  httplib::Client* client GUARDED_BY(mu) = nullptr;  // the one polling now, for Stop
  // The last batch applied (0, 0: none; ask for a snapshot). Poller thread only.
  uint64_t epoch = 0;
  uint64_t seq = 0;
};

KvEventFeed::KvEventFeed(KvIndex* index, const KvFeedOptions& options)
    : index_(index), options_(options) {}

KvEventFeed::~KvEventFeed() { Stop(); }

void KvEventFeed::StopPoller(Poller* p) {
  {
    MutexLock lock(&p->mu);
    p->stop = true;
    if (p->client != nullptr) p->client->stop();  // ends a long poll in flight
    p->wake.SignalAll();
  }
  if (p->thread.joinable()) p->thread.join();
}

void KvEventFeed::SetBackends(const std::vector<std::string>& urls) {
  std::vector<std::unique_ptr<Poller>> gone;
  {
    MutexLock lock(&mu_);
    for (auto it = pollers_.begin(); it != pollers_.end();) {
      if (std::find(urls.begin(), urls.end(), it->first) == urls.end()) {
        gone.push_back(std::move(it->second));
        it = pollers_.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::string& url : urls) {
      if (pollers_.count(url) != 0) continue;
      auto p = std::make_unique<Poller>();
      p->url = url;
      Poller* raw = p.get();
      pollers_[url] = std::move(p);
      raw->thread = std::thread([this, raw] { Run(raw); });
    }
  }
  for (auto& p : gone) {
    StopPoller(p.get());
    index_->Remove(p->url);
  }
}

void KvEventFeed::Stop() {
  std::map<std::string, std::unique_ptr<Poller>> all;
  {
    MutexLock lock(&mu_);
    all.swap(pollers_);
  }
  for (auto& [url, p] : all) StopPoller(p.get());
}

Status KvEventFeed::PollOnce(Poller* p, httplib::Client& client) {
  const std::string path = "/v1/kv_events?epoch=" + std::to_string(p->epoch) +
                           "&after=" + std::to_string(p->seq) +
                           "&wait_ms=" + std::to_string(options_.wait_ms);
  httplib::Headers headers;
  if (!options_.api_key.empty()) headers.emplace("Authorization", "Bearer " + options_.api_key);
  auto res = client.Get(path.c_str(), headers);
  if (!res) return Unavailable("GET /v1/kv_events: " + httplib::to_string(res.error()));
  if (res->status != 200)
    return Unavailable("GET /v1/kv_events: HTTP " + std::to_string(res->status) + ": " +
                       res->body.substr(0, 200));
  ASSIGN_OR_RETURN(KvEventsReply reply, ParseKvEventsJson(res->body));
  if (options_.check_tokenizer && reply.tokenizer != options_.tokenizer_fingerprint)
    return FailedPrecondition("it tokenizes differently from the router's --model (tokenizer " +
                              std::to_string(reply.tokenizer) + ", the router's " +
                              std::to_string(options_.tokenizer_fingerprint) +
                              "): its cache is ignored");
  if (reply.batch.page_size <= 0)
    return FailedPrecondition("it has no prefix cache (--no-enable-prefix-caching)");
  if (reply.batch.snapshot) {
    index_->ApplySnapshot(p->url, reply.batch);
  } else {
    RETURN_IF_ERROR(index_->ApplyEvents(p->url, reply.batch));
  }
  p->epoch = reply.batch.epoch;
  p->seq = reply.batch.seq;
  return OkStatus();
}

void KvEventFeed::Run(Poller* p) {
  httplib::Client client(p->url);
  client.set_connection_timeout(std::chrono::milliseconds(options_.timeout_ms));
  client.set_read_timeout(std::chrono::milliseconds(options_.timeout_ms + options_.wait_ms));
  client.set_keep_alive(true);
  {
    MutexLock lock(&p->mu);
    p->client = &client;
  }
  while (true) {
    {
      MutexLock lock(&p->mu);
      if (p->stop) break;
    }
    Status s = PollOnce(p, client);
    if (s.ok()) continue;
    {
      MutexLock lock(&p->mu);
      if (p->stop) break;
    }
    failures_.fetch_add(1);
    index_->MarkUnsynced(p->url, s.message());
    p->epoch = p->seq = 0;  // the next poll asks for a snapshot
    PD_LOG_WARN_EVERY_N_SEC(10.0, p->url, "{}: KV events of {}: {}; chosen by load only",
                            options_.log_name, p->url, s.message());
    MutexLock lock(&p->mu);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.retry_ms);
    while (!p->stop && p->wake.WaitUntil(&p->mu, deadline)) {
    }
  }
  MutexLock lock(&p->mu);
  p->client = nullptr;
}

}  // namespace pd::server
