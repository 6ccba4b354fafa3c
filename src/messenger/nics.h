// The NICs a messenger uses (--fabric-nics): one fabric domain per NIC, the first of which also
// carries the control messages, the metadata and checksum writes; KV writes stripe over all.
//
//   ASSIGN_OR_RETURN(auto nics, ResolveNics("auto", "verbs;ofi_rxm"));   // {"mlx5_0", "mlx5_1"}
//   transfer::DomainOptions nic1 = NicDomainOptions(base, nics[1]);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transfer/domain.h"

namespace pd::messenger {

// The domain options of one NIC: `nic` is an IP address (the endpoint binds there: the tcp
// provider's way to choose an interface) or a provider domain name ("mlx5_0", "eth1").
transfer::DomainOptions NicDomainOptions(const transfer::DomainOptions& base,
                                         const std::string& nic);

// --fabric-nics: "" or "default" -> {} (one domain as the other fabric flags say); "auto" -> the
// RDMA NICs (hwloc) that `provider` offers and that are nearest the CPUs this process may run on
// (all offered RDMA NICs when none is nearer), else {} (the one default interface); otherwise a
// comma-separated list of addresses or domain names (at most kMaxNics, no duplicates).
Result<std::vector<std::string>> ResolveNics(const std::string& flag, const std::string& provider);

// Refuses a provider that cannot carry KV writes: RMA writes with remote CQ data of at least 4
// bytes (the immediates the decode side counts). Names the provider and what it lacks.
Status CheckKvCapabilities(const transfer::DomainInfo& info);

// The label of a NIC in logs and in /metrics: the entry it was opened from, else the provider's
// domain name.
std::string NicLabel(const transfer::DomainOptions& options, const transfer::DomainInfo& info);

// Opens NICs 1.. of `nics` (NIC 0 is the messenger's control domain, opened by the caller) with
// `base`'s options, sharing `imm_counters` so writes landing on any NIC count together. base.faults
// stays with NIC 0; NIC i gets faults[i] where given (tests only).
Result<std::vector<std::unique_ptr<transfer::Domain>>> OpenExtraNics(
    const transfer::DomainOptions& base, const std::vector<std::string>& nics,
    std::shared_ptr<transfer::ImmCounterTable> imm_counters,
    const std::vector<std::shared_ptr<transfer::FaultInjector>>& faults = {});

}  // namespace pd::messenger
