#include "messenger/nics.h"

#include <arpa/inet.h>
#include <sched.h>

#include <algorithm>
#include <set>

#include "common/log.h"
#include "messenger/wire.h"
#include "transfer/topology.h"

namespace pd::messenger {
namespace {

bool IsIpAddress(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// RDMA NICs the provider offers, those with a core this process may run on first.
std::vector<std::string> NearestRdmaNics(const transfer::Topology& t) {
  std::set<std::string> offered;
  for (const auto& i : t.interfaces) offered.insert(i.domain);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool have_mask = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
  std::vector<std::string> near, far;
  for (const transfer::NicInfo& nic : t.nics) {
    if (!nic.rdma || offered.count(nic.name) == 0) continue;
    const bool is_near = have_mask && std::any_of(nic.cores.begin(), nic.cores.end(), [&](int c) {
                           return c >= 0 && c < CPU_SETSIZE && CPU_ISSET(c, &allowed);
                         });
    (is_near ? near : far).push_back(nic.name);
  }
  return near.empty() ? far : near;
}

}  // namespace

transfer::DomainOptions NicDomainOptions(const transfer::DomainOptions& base,
                                         const std::string& nic) {
  transfer::DomainOptions d = base;
  if (IsIpAddress(nic)) {
    d.node = nic;
    d.domain_name.clear();
  } else {
    d.domain_name = nic;
  }
  return d;
}

Result<std::vector<std::string>> ResolveNics(const std::string& flag, const std::string& provider) {
  if (flag.empty() || flag == "default") return std::vector<std::string>{};
  if (flag == "auto") {
    auto topology = transfer::DiscoverTopology(provider);
    if (!topology.ok()) {
      PD_LOG_WARN("--fabric-nics auto: {}; using the default interface",
                  topology.status().ToString());
      return std::vector<std::string>{};
    }
    std::vector<std::string> nics = NearestRdmaNics(*topology);
    if (nics.size() > kMaxNics) nics.resize(kMaxNics);
    return nics;
  }
  std::vector<std::string> nics = SplitList(flag);
  std::set<std::string> seen;
  for (const std::string& n : nics) {
    if (n.empty()) return InvalidArgument("--fabric-nics '" + flag + "' has an empty entry");
    if (!seen.insert(n).second) {
      return InvalidArgument("--fabric-nics '" + flag + "' names '" + n + "' twice");
    }
  }
  if (nics.size() > kMaxNics) {
    return InvalidArgument("--fabric-nics '" + flag + "' names " + std::to_string(nics.size()) +
                           " NICs, more than the " + std::to_string(kMaxNics) + " supported");
  }
  return nics;
}

Status CheckKvCapabilities(const transfer::DomainInfo& info) {
  if (info.cq_data_size < 4) {
    return FailedPrecondition("libfabric provider '" + info.provider + "' (domain '" + info.domain +
                              "') offers " + std::to_string(info.cq_data_size) +
                              " bytes of remote CQ data: KV transfers need RMA writes with remote "
                              "CQ data (FI_RMA with FI_REMOTE_CQ_DATA, at least 4 bytes)");
  }
  return OkStatus();
}

std::string NicLabel(const transfer::DomainOptions& options, const transfer::DomainInfo& info) {
  if (!options.node.empty()) return options.node;
  if (!options.domain_name.empty()) return options.domain_name;
  return info.domain;
}

Result<std::vector<std::unique_ptr<transfer::Domain>>> OpenExtraNics(
    const transfer::DomainOptions& base, const std::vector<std::string>& nics,
    std::shared_ptr<transfer::ImmCounterTable> imm_counters,
    const std::vector<std::shared_ptr<transfer::FaultInjector>>& faults) {
  std::vector<std::unique_ptr<transfer::Domain>> out;
  for (size_t i = 1; i < nics.size(); ++i) {
    transfer::DomainOptions d = NicDomainOptions(base, nics[i]);
    d.on_message = nullptr;  // control messages travel on NIC 0 only
    d.imm_counters = imm_counters;
    d.faults = i < faults.size() ? faults[i] : nullptr;
    auto domain = transfer::Domain::Create(d);
    if (!domain.ok()) return domain.status().WithContext("NIC " + nics[i]);
    RETURN_IF_ERROR(CheckKvCapabilities((*domain)->info()).WithContext("NIC " + nics[i]));
    out.push_back(std::move(*domain));
  }
  return out;
}

}  // namespace pd::messenger
