// A client of etcd's v3 API through its HTTP/JSON gateway (keys and values base64 in JSON, 64-bit
// numbers as strings): leases (grant, keep alive, revoke), put, delete, prefix range, and prefix
// watches as a streaming POST to /v3/watch. Requests go to the endpoint that answered last and move
// on to the next one when it cannot be reached, so a cluster of etcd members is used as one.
//
//   ASSIGN_OR_RETURN(EtcdOptions o, ParseEtcdUrl("etcd://10.0.0.5:2379,10.0.0.6:2379"));
//   EtcdClient etcd(o);
//   ASSIGN_OR_RETURN(int64_t lease, etcd.GrantLease(10));
//   RETURN_IF_ERROR(etcd.Put("/pdserve/c/decode/a", "{...}", lease));
//
// Thread safety: every method may be called from any thread; an EtcdWatch has one reader.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cluster/http_call.h"
#include "common/status.h"

namespace pd::cluster {

struct EtcdOptions {
  std::vector<HostPort> endpoints;
  int timeout_ms = 2000;  // per request (connect, send, answer)
};

// "etcd://HOST:PORT[,HOST:PORT...]". InvalidArgument naming what is wrong.
Result<EtcdOptions> ParseEtcdUrl(const std::string& url);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision the range was read at
};

struct WatchEvent {
  enum class Type { kPut, kDelete } type = Type::kPut;
  KeyValue kv;  // a delete carries only the key and its revision
};

// The end of the key range holding every key that starts with `prefix` (etcd's range_end).
std::string PrefixRangeEnd(const std::string& prefix);

class EtcdWatch;

class EtcdClient {
 public:
  explicit EtcdClient(EtcdOptions options);

  // A lease of ttl_s seconds; its id.
  Result<int64_t> GrantLease(int64_t ttl_s);
  // Refreshes the lease; its TTL from now. NotFound when the lease has expired or was revoked.
  Result<int64_t> KeepAlive(int64_t lease);
  // Ends the lease and deletes every key attached to it. NotFound when it had ended already.
  Status Revoke(int64_t lease);
  // lease 0: no lease.
  Status Put(const std::string& key, const std::string& value, int64_t lease = 0);
  Status Delete(const std::string& key);
  Result<RangeResult> RangePrefix(const std::string& prefix);
  // Every change under `prefix` from start_revision on (0: from now). The watch is created on
  // return (etcd confirmed it).
  Result<std::unique_ptr<EtcdWatch>> WatchPrefix(const std::string& prefix, int64_t start_revision);

  const EtcdOptions& options() const { return options_; }

 private:
  // POSTs `body` to `path` on the endpoints in turn, from the one that answered last; the JSON
  // answer. An error answer from etcd becomes a Status with its gRPC code and message.
  Result<std::string> Call(const std::string& path, const std::string& body);

  const EtcdOptions options_;
  std::atomic<size_t> current_{0};  // the endpoint that answered last
};

class EtcdWatch {
 public:
  explicit EtcdWatch(std::unique_ptr<HttpStream> stream) : stream_(std::move(stream)) {}
  // Waits up to timeout_ms for events (appended to *events). OK, perhaps with none; an error
  // when the watch broke (etcd gone: Unavailable; compacted past start_revision: OutOfRange) or
  // was cancelled.
  Status Next(int timeout_ms, std::vector<WatchEvent>* events);
  // From any thread: Next returns Cancelled at once.
  void Cancel() { stream_->Cancel(); }

 private:
  Status Parse(const std::string& message, std::vector<WatchEvent>* events);
  std::unique_ptr<HttpStream> stream_;
  std::string buffer_;  // bytes of a message not yet whole
};

}  // namespace pd::cluster
