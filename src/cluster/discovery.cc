#include "cluster/discovery.h"

#include <memory>
#include <mutex>
#include <set>

#include "common/log.h"
#include "messenger/decode_side.h"
#include "server/router.h"

namespace pd::cluster {
namespace {

Result<std::string> FromHex(const std::string& hex) {
  if (hex.size() % 2 != 0) return InvalidArgument("odd-length hex string");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (size_t k = 0; k < 2; ++k) {
      const char c = hex[i + k];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return InvalidArgument("not a hex string");
      v = v * 16 + d;
    }
    out += static_cast<char>(v);
  }
  return out;
}

MemberWatchOptions WatchOptions(const DiscoveryFlags& flags, const std::string& role,
                                const std::string& secret) {
  MemberWatchOptions o;
  o.etcd = ParseEtcdUrl(flags.url).value();  // ValidateDiscoveryFlags checked it
  o.prefix = RolePrefix(flags.cluster, role);
  o.secret = secret;
  return o;
}

}  // namespace

Status ValidateDiscoveryFlags(const DiscoveryFlags& flags) {
  if (!flags.enabled()) return OkStatus();
  if (auto o = ParseEtcdUrl(flags.url); !o.ok()) return o.status().WithContext("--discovery");
  RETURN_IF_ERROR(ValidateClusterName(flags.cluster));
  if (flags.ttl_s < 2 || flags.ttl_s > 3600) {
    return InvalidArgument("--discovery-ttl-s must be in 2..3600, got " +
                           std::to_string(flags.ttl_s));
  }
  if (!flags.advertise_url.empty() && flags.advertise_url.rfind("http://", 0) != 0) {
    return InvalidArgument("--advertise-url must be http://HOST:PORT, got '" + flags.advertise_url +
                           "'");
  }
  return OkStatus();
}

Result<std::string> AdvertiseUrl(const DiscoveryFlags& flags, const std::string& host, int port) {
  if (!flags.advertise_url.empty()) return flags.advertise_url;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    return InvalidArgument("--host " + (host.empty() ? std::string("''") : host) +
                           " listens on every address: give --advertise-url http://ADDRESS:" +
                           std::to_string(port) + " (the address the others reach it at)");
  }
  return "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

Result<std::unique_ptr<Registration>> RegisterMember(const DiscoveryFlags& flags, Member member,
                                                     const std::string& secret) {
  if (member.name.empty()) member.name = member.http_url;
  RegistrationOptions o;
  ASSIGN_OR_RETURN(o.etcd, ParseEtcdUrl(flags.url));
  // The name is a URL: its '/' would nest keys, so they become '_'.
  for (char& c : member.name) {
    if (c == '/') c = '_';
  }
  o.key = MemberKey(flags.cluster, member);
  o.value = EncodeMember(member, secret);
  o.ttl_s = flags.ttl_s;
  ASSIGN_OR_RETURN(auto r, Registration::Create(o));
  PD_LOG_INFO("etcd: registered {} ({} at {}, lease TTL {} s)", o.key, member.role, member.http_url,
              flags.ttl_s);
  return r;
}

Result<std::unique_ptr<MemberWatch>> FeedRouter(const DiscoveryFlags& flags,
                                                const std::string& secret, server::Router* router) {
  MemberWatchOptions o = WatchOptions(flags, "decode", secret);
  o.on_change = [router](const std::vector<Member>& members) {
    std::vector<std::string> urls;
    for (const Member& m : members) urls.push_back(m.http_url);
    if (Status s = router->SetBackends(urls); !s.ok()) {
      PD_LOG_WARN("etcd: decode instances not used: {}", s.message());
    }
    PD_LOG_INFO("etcd: {} decode instance(s) in the cluster", urls.size());
  };
  return MemberWatch::Create(o);
}

Result<std::unique_ptr<MemberWatch>> FeedDecodeMessenger(const DiscoveryFlags& flags,
                                                         const std::string& secret,
                                                         const std::string& model_fingerprint,
                                                         messenger::DecodeMessenger* messenger) {
  MemberWatchOptions o = WatchOptions(flags, "prefill", secret);
  auto logged = std::make_shared<std::set<std::string>>();  // the watch thread's alone
  o.on_change = [messenger, model_fingerprint, logged](const std::vector<Member>& members) {
    std::vector<messenger::PrefillPeer> peers;
    for (const Member& m : members) {
      Result<std::string> address = FromHex(m.fabric_address);
      std::string why;
      if (m.model_fingerprint != model_fingerprint) {
        why = "it serves another model (fingerprint " + m.model_fingerprint + ", ours " +
              model_fingerprint + ")";
      } else if (!address.ok() || address->empty()) {
        why = "its fabric address is not valid";
      }
      if (!why.empty()) {
        if (logged->insert(m.http_url + why).second) {
          PD_LOG_WARN("etcd: ignoring prefill instance {}: {}", m.http_url, why);
        }
        continue;
      }
      peers.push_back({m.http_url, *address});
    }
    messenger->SetPeers(peers);
  };
  return MemberWatch::Create(o);
}

}  // namespace pd::cluster
