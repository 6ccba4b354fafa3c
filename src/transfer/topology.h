// Where the NICs are: hwloc finds network and RDMA devices, the cores nearest each, and the
// accelerators (GPUs, co-processors) with the NICs nearest them; libfabric says which interfaces a
// provider can use. On machines without an RDMA NIC the provider's interfaces are the NICs.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pd::transfer {

struct NicInfo {
  std::string name;        // OS name: "mlx5_0", "eth0"
  bool rdma = false;       // an OpenFabrics (verbs) device rather than a plain network interface
  std::string pci_bus_id;  // "0000:3b:00.0"; empty when not on PCI
  int numa_node = -1;
  std::vector<int> cores;  // OS indexes of the processing units nearest the device
};

struct AcceleratorInfo {
  std::string name;  // hwloc OS device name: "cuda0", "card1", "nvidia0"...
  std::string pci_bus_id;
  int numa_node = -1;
  std::vector<int> cores;
  std::vector<std::string> nearest_nics;  // RDMA NICs first, closest first
};

// One interface a libfabric provider offers (fi_getinfo's domain), e.g. "lo", "eth0", "mlx5_0".
struct FabricInterface {
  std::string provider;
  std::string fabric;  // e.g. "127.0.0.1/32"
  std::string domain;
};

struct Topology {
  int num_cores = 0;
  std::vector<NicInfo> nics;                  // from hwloc (may be empty in VMs and containers)
  std::vector<AcceleratorInfo> accelerators;  // from hwloc
  std::vector<FabricInterface> interfaces;    // from libfabric, for the provider asked about
};

// Discovers the machine. `provider` is a libfabric provider name ("tcp;ofi_rxm"); an unavailable
// provider leaves `interfaces` empty rather than failing.
Result<Topology> DiscoverTopology(const std::string& provider);

// The domain names to open for work near `accelerator` (an index into accelerators, or -1 for
// "no device"): its nearest RDMA NICs that the provider exposes, else every provider interface
// except loopback, else loopback.
std::vector<std::string> DomainsForDevice(const Topology& topology, int accelerator);

}  // namespace pd::transfer
