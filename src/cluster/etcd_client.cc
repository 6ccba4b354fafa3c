#include "cluster/etcd_client.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "cluster/base64.h"

namespace pd::cluster {
namespace {

using json = nlohmann::json;

// etcd's JSON gateway writes int64 fields as strings, and leaves out fields that are zero.
int64_t Int64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

// The gRPC code etcd puts in an error answer, as ours.
StatusCode CodeOf(int grpc_code) {
  switch (grpc_code) {
    case 3:
      return StatusCode::kInvalidArgument;
    case 4:
      return StatusCode::kDeadlineExceeded;
    case 5:
      return StatusCode::kNotFound;
    case 8:
      return StatusCode::kResourceExhausted;
    case 9:
      return StatusCode::kFailedPrecondition;
    case 11:
      return StatusCode::kOutOfRange;
    case 14:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

// An answer's error object ({"error": ..., "code": N, "message": ...}, or {"error": {...}} in a
// stream), as a Status; OK when there is none.
Status ErrorIn(const json& j) {
  const json* e = &j;
  if (j.contains("error") && j["error"].is_object()) e = &j["error"];
  if (!e->contains("message") || (!e->contains("code") && !e->contains("grpc_code"))) {
    return OkStatus();
  }
  const int code =
      e->contains("grpc_code") ? (*e)["grpc_code"].get<int>() : (*e)["code"].get<int>();
  return Status(CodeOf(code), "etcd: " + (*e)["message"].get<std::string>());
}

Result<KeyValue> ParseKv(const json& kv) {
  KeyValue out;
  ASSIGN_OR_RETURN(out.key, Base64Decode(kv.value("key", "")));
  ASSIGN_OR_RETURN(out.value, Base64Decode(kv.value("value", "")));
  out.mod_revision = Int64Field(kv, "mod_revision");
  out.lease = Int64Field(kv, "lease");
  return out;
}

}  // namespace

Result<EtcdOptions> ParseEtcdUrl(const std::string& url) {
  constexpr std::string_view kScheme = "etcd://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) {
    return InvalidArgument("'" + url + "' is not etcd://HOST:PORT[,HOST:PORT...]");
  }
  EtcdOptions o;
  std::stringstream list(url.substr(kScheme.size()));
  std::string item;
  while (std::getline(list, item, ',')) {
    if (item.empty()) continue;
    auto hp = ParseHostPort(item);
    if (!hp.ok()) return InvalidArgument("'" + url + "': " + hp.status().message());
    o.endpoints.push_back(*hp);
  }
  if (o.endpoints.empty()) return InvalidArgument("'" + url + "' names no etcd endpoint");
  return o;
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}

Result<std::string> EtcdClient::Call(const std::string& path, const std::string& body) {
  const size_t n = options_.endpoints.size();
  if (n == 0) return FailedPrecondition("no etcd endpoint");
  const size_t first = current_.load();
  std::string errors;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n;
    Result<HttpReply> reply = HttpPost(options_.endpoints[i], path, body, options_.timeout_ms);
    if (!reply.ok()) {
      errors += (errors.empty() ? "" : "; ") + reply.status().message();
      continue;
    }
    current_ = i;
    if (reply->status != 200) {
      try {
        Status s = ErrorIn(json::parse(reply->body));
        if (!s.ok()) return s;
      } catch (const std::exception&) {
      }
      return Unavailable("etcd " + options_.endpoints[i].ToString() + path + ": HTTP " +
                         std::to_string(reply->status) + ": " + reply->body.substr(0, 300));
    }
    return std::move(reply->body);
  }
  return Unavailable("no etcd endpoint answered: " + errors);
}

Result<int64_t> EtcdClient::GrantLease(int64_t ttl_s) {
  ASSIGN_OR_RETURN(std::string body, Call("/v3/lease/grant", json{{"TTL", ttl_s}}.dump()));
  try {
    const json j = json::parse(body);
    RETURN_IF_ERROR(ErrorIn(j));
    const int64_t id = Int64Field(j, "ID");
    if (id == 0) return Internal("etcd: lease grant answered without an ID: " + body);
    return id;
  } catch (const std::exception& e) {
    return Internal(std::string("etcd: lease grant: ") + e.what());
  }
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  ASSIGN_OR_RETURN(std::string body,
                   Call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()));
  try {
    // One streamed message: {"result": {...}} (or {"error": {...}}), perhaps newline-ended.
    const json j = json::parse(body.substr(0, body.find('\n')));
    RETURN_IF_ERROR(ErrorIn(j));
    const int64_t ttl = Int64Field(j.value("result", json::object()), "TTL");
    if (ttl <= 0) return NotFound("etcd: lease " + std::to_string(lease) + " has expired");
    return ttl;
  } catch (const std::exception& e) {
    return Internal(std::string("etcd: lease keepalive: ") + e.what());
  }
}

Status EtcdClient::Revoke(int64_t lease) {
  ASSIGN_OR_RETURN(std::string body,
                   Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump()));
  return OkStatus();
}

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  json req = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  return Call("/v3/kv/put", req.dump()).status();
}

Status EtcdClient::Delete(const std::string& key) {
  return Call("/v3/kv/deleterange", json{{"key", Base64Encode(key)}}.dump()).status();
}

Result<RangeResult> EtcdClient::RangePrefix(const std::string& prefix) {
  const json req = {{"key", Base64Encode(prefix)},
                    {"range_end", Base64Encode(PrefixRangeEnd(prefix))}};
  ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/range", req.dump()));
  RangeResult out;
  try {
    const json j = json::parse(body);
    out.revision = Int64Field(j.value("header", json::object()), "revision");
    for (const json& kv : j.value("kvs", json::array())) {
      ASSIGN_OR_RETURN(KeyValue k, ParseKv(kv));
      out.kvs.push_back(std::move(k));
    }
  } catch (const std::exception& e) {
    return Internal(std::string("etcd: range: ") + e.what());
  }
  return out;
}

Result<std::unique_ptr<EtcdWatch>> EtcdClient::WatchPrefix(const std::string& prefix,
                                                           int64_t start_revision) {
  json create = {{"key", Base64Encode(prefix)},
                 {"range_end", Base64Encode(PrefixRangeEnd(prefix))}};
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  const std::string body = json{{"create_request", create}}.dump();
  const size_t n = options_.endpoints.size();
  std::string errors;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (current_.load() + k) % n;
    auto stream = HttpStream::Open(options_.endpoints[i], "/v3/watch", body, options_.timeout_ms);
    if (!stream.ok()) {
      errors += (errors.empty() ? "" : "; ") + stream.status().message();
      continue;
    }
    auto watch = std::make_unique<EtcdWatch>(std::move(stream).value());
    // The first message confirms the watch ({"result": {"created": true, ...}}).
    std::vector<WatchEvent> none;
    Status s = watch->Next(options_.timeout_ms, &none);
    if (!s.ok()) return s.WithContext("etcd watch on " + options_.endpoints[i].ToString());
    current_ = i;
    return watch;
  }
  return Unavailable("no etcd endpoint took the watch: " + errors);
}

Status EtcdWatch::Next(int timeout_ms, std::vector<WatchEvent>* events) {
  std::vector<std::string> pieces;
  RETURN_IF_ERROR(stream_->Read(timeout_ms, &pieces));
  for (const std::string& p : pieces) buffer_ += p;
  // The gateway ends each message with a newline.
  size_t end;
  while ((end = buffer_.find('\n')) != std::string::npos) {
    const std::string message = buffer_.substr(0, end);
    buffer_.erase(0, end + 1);
    if (message.find_first_not_of(" \r\t") == std::string::npos) continue;
    RETURN_IF_ERROR(Parse(message, events));
  }
  return OkStatus();
}

Status EtcdWatch::Parse(const std::string& message, std::vector<WatchEvent>* events) {
  try {
    const json j = json::parse(message);
    RETURN_IF_ERROR(ErrorIn(j));
    const json r = j.value("result", json::object());
    if (r.value("canceled", false)) {
      const int64_t compacted = Int64Field(r, "compact_revision");
      if (compacted > 0) {
        return OutOfRange("etcd: the watch's start revision was compacted (now " +
                          std::to_string(compacted) + ")");
      }
      return Unavailable("etcd cancelled the watch: " + r.value("cancel_reason", std::string()));
    }
    for (const json& e : r.value("events", json::array())) {
      WatchEvent ev;
      ev.type = e.value("type", std::string()) == "DELETE" ? WatchEvent::Type::kDelete
                                                           : WatchEvent::Type::kPut;
      ASSIGN_OR_RETURN(ev.kv, ParseKv(e.value("kv", json::object())));
      events->push_back(std::move(ev));
    }
  } catch (const std::exception& e) {
    return Internal(std::string("etcd: watch message: ") + e.what() + ": " +
                    message.substr(0, 200));
  }
  return OkStatus();
}

}  // namespace pd::cluster
