// What an instance publishes about itself in etcd, and where: the key
// /pdserve/<cluster>/<role>/<name> holds a JSON description signed with HMAC-SHA256 keyed by the
// cluster secret (the one that authenticates the messenger's control messages), so a member that
// someone wrote into etcd without the secret is ignored. Without a secret (--insecure-no-secret,
// loopback only) the MAC is keyed by the empty string: integrity only.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pd::cluster {

struct Member {
  std::string role;               // "prefill" | "decode"
  std::string name;               // unique in the cluster and role; the HTTP URL by default
  std::string http_url;           // "http://10.0.0.7:8101"
  std::string fabric_address;     // hex of the messenger's fabric endpoint name ("" for none)
  std::string model_fingerprint;  // messenger::ModelFingerprint, decimal
  int tensor_parallel_size = 1;
  std::vector<std::string> nics;  // the fabric NICs it uses ("" entries never)
};

// The key prefix under which every member of `role` in `cluster` lives ("/pdserve/c/decode/").
std::string RolePrefix(const std::string& cluster, const std::string& role);
std::string MemberKey(const std::string& cluster, const Member& member);

// The value stored at MemberKey: {"member": {...}, "mac": "<hex HMAC-SHA256>"}.
std::string EncodeMember(const Member& member, const std::string& secret);
// The member in `value`; FailedPrecondition when its MAC does not match
// (another secret, or forged), InvalidArgument when it is malformed.
Result<Member> DecodeMember(const std::string& value, const std::string& secret);

// Cluster names are path segments: letters, digits, '-', '_' and '.', 1 to 63 of them.
Status ValidateClusterName(const std::string& cluster);

}  // namespace pd::cluster
