#include "server/kv_events_wire.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"

namespace pd::server {
namespace {

using json = nlohmann::json;

// A query parameter as an unsigned integer; `fallback` when absent.
Result<uint64_t> QueryNumber(const httplib::Request& req, const char* name, uint64_t fallback) {
  if (!req.has_param(name)) return fallback;
  const std::string v = req.get_param_value(name);
  uint64_t out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty())
    return InvalidArgument(std::string("query parameter '") + name +
                           "' must be an unsigned integer, got '" + v + "'");
  return out;
}

}  // namespace

std::string KvEventsJson(const KvEventsReply& reply) {
  const engine::KvEventBatch& b = reply.batch;
  json j = {{"epoch", b.epoch},         {"root", b.root},
            {"page_size", b.page_size}, {"tokenizer", reply.tokenizer},
            {"snapshot", b.snapshot},   {"seq", b.seq}};
  if (b.snapshot) {
    j["keys"] = b.keys;
  } else {
    json events = json::array();
    for (const engine::KvEvent& e : b.events) events.push_back({e.seq, e.stored ? 1 : 0, e.key});
    j["events"] = std::move(events);
  }
  return j.dump();
}

Result<KvEventsReply> ParseKvEventsJson(const std::string& body) {
  try {
    const json j = json::parse(body);
    KvEventsReply r;
    engine::KvEventBatch& b = r.batch;
    b.epoch = j.at("epoch").get<uint64_t>();
    b.root = j.at("root").get<uint64_t>();
    b.page_size = j.at("page_size").get<int>();
    r.tokenizer = j.at("tokenizer").get<uint64_t>();
    b.snapshot = j.at("snapshot").get<bool>();
    b.seq = j.at("seq").get<uint64_t>();
    if (b.snapshot) {
      b.keys = j.at("keys").get<std::vector<uint64_t>>();
    } else {
      for (const json& e : j.at("events")) {
        if (!e.is_array() || e.size() != 3)
          return InvalidArgument("kv_events: an event is not [seq, stored, key]: " + e.dump());
        b.events.push_back({e[0].get<uint64_t>(), e[1].get<int>() != 0, e[2].get<uint64_t>()});
      }
    }
    return r;
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("kv_events: malformed answer: ") + e.what());
  }
}

void HandleKvEvents(engine::KvEventLog* log, uint64_t tokenizer_fingerprint,
                    const httplib::Request& req, httplib::Response& res) {
  auto fail = [&res](int status, const std::string& message) {
    res.status = status;
    res.set_content(ErrorBody(status, message), "application/json");
  };
  if (log == nullptr)
    return fail(404, "this instance publishes no KV events (it has no prefix cache)");
  auto epoch = QueryNumber(req, "epoch", 0);
  auto after = QueryNumber(req, "after", 0);
  auto wait_ms = QueryNumber(req, "wait_ms", 0);
  auto max_events = QueryNumber(req, "max_events", 4096);
  for (const Status& s : {epoch.status(), after.status(), wait_ms.status(), max_events.status()}) {
    if (!s.ok()) return fail(400, s.message());
  }
  KvEventsReply reply;
  reply.tokenizer = tokenizer_fingerprint;
  reply.batch = log->Poll(
      *epoch, *after, std::chrono::milliseconds(std::min<uint64_t>(*wait_ms, kMaxKvEventsWaitMs)),
      static_cast<size_t>(std::min<uint64_t>(*max_events, 1 << 16)));
  res.status = 200;
  res.set_content(KvEventsJson(reply), "application/json");
}

}  // namespace pd::server
