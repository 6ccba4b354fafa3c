// Discovery through etcd for `serve` and `router` (--discovery etcd://HOST:PORT[,...] --cluster
// NAME): an instance registers itself (cluster/registration.h) and the roles that send work watch
// the roles that take it (cluster/member_watch.h): the router watches decode instances and feeds
// them to Router::SetBackends; a decode instance watches prefill instances and feeds those with
// its model's fingerprint to DecodeMessenger::SetPeers. Without --discovery nothing here runs.
//
// Thread safety: the watches call into the router or messenger from their own threads (both
// accept that); stop a watch before destroying what it feeds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cluster/etcd_client.h"
#include "cluster/member.h"
#include "cluster/member_watch.h"
#include "cluster/registration.h"
#include "common/status.h"

namespace pd::messenger {
class DecodeMessenger;
}
namespace pd::server {
class Router;
}

namespace pd::cluster {

struct DiscoveryFlags {
  std::string url;                  // --discovery: "" (off) or etcd://HOST:PORT[,HOST:PORT...]
  std::string cluster = "default";  // --cluster
  int64_t ttl_s = 10;               // --discovery-ttl-s: the registration's lease
  // --advertise-url: the HTTP URL the others reach this instance at ("": http://HOST:PORT from
  // --host and the bound port, which must then be a concrete address).
  std::string advertise_url;
  bool enabled() const { return !url.empty(); }
};

// Checks the flags without contacting etcd; each error names its flag.
Status ValidateDiscoveryFlags(const DiscoveryFlags& flags);
// The URL this instance advertises: flags.advertise_url, or http://host:port. InvalidArgument
// when host listens on every address (0.0.0.0, ::, "") and no --advertise-url says which.
Result<std::string> AdvertiseUrl(const DiscoveryFlags& flags, const std::string& host, int port);

// Registers `member` under flags.cluster (its name defaults to its http_url) with a lease of
// flags.ttl_s kept alive; the MAC is keyed by `secret`.
Result<std::unique_ptr<Registration>> RegisterMember(const DiscoveryFlags& flags, Member member,
                                                     const std::string& secret);

// The router's backends follow the cluster's decode instances.
Result<std::unique_ptr<MemberWatch>> FeedRouter(const DiscoveryFlags& flags,
                                                const std::string& secret, server::Router* router);

// The decode messenger's peers follow the cluster's prefill instances whose model fingerprint is
// `model_fingerprint` (others are ignored, and logged once).
Result<std::unique_ptr<MemberWatch>> FeedDecodeMessenger(const DiscoveryFlags& flags,
                                                         const std::string& secret,
                                                         const std::string& model_fingerprint,
                                                         messenger::DecodeMessenger* messenger);

}  // namespace pd::cluster
