#include "transfer/topology.h"

#include <hwloc.h>
#include <rdma/fabric.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "transfer/fabric_util.h"

namespace pd::transfer {
namespace {

std::vector<int> CoresOf(hwloc_const_cpuset_t cpuset) {
  std::vector<int> cores;
  if (cpuset == nullptr) return cores;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, cpuset) cores.push_back(static_cast<int>(i));
  hwloc_bitmap_foreach_end();
  return cores;
}

std::string PciBusId(hwloc_obj_t pci) {
  if (pci == nullptr || pci->type != HWLOC_OBJ_PCI_DEVICE) return {};
  char buf[32];
  snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
           pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

struct Placement {
  std::string pci;
  int numa = -1;
  std::vector<int> cores;
  hwloc_obj_t ancestor = nullptr;
};

Placement Place(hwloc_topology_t topo, hwloc_obj_t osdev) {
  Placement p;
  p.pci = PciBusId(osdev->parent);
  p.ancestor = hwloc_get_non_io_ancestor_obj(topo, osdev);
  if (p.ancestor != nullptr) {
    p.cores = CoresOf(p.ancestor->cpuset);
    if (p.ancestor->nodeset != nullptr) p.numa = hwloc_bitmap_first(p.ancestor->nodeset);
  }
  return p;
}

std::vector<FabricInterface> ProviderInterfaces(const std::string& provider) {
  std::vector<FabricInterface> out;
  FiInfoPtr hints(fi_allocinfo());
  if (!hints) return out;
  hints->caps = FI_MSG | FI_RMA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* info = nullptr;
  if (fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &info) != 0) return out;
  FiInfoPtr owned(info);
  std::set<std::pair<std::string, std::string>> seen;
  for (fi_info* i = info; i != nullptr; i = i->next) {
    std::string fabric = i->fabric_attr->name ? i->fabric_attr->name : "";
    std::string domain = i->domain_attr->name ? i->domain_attr->name : "";
    if (!seen.insert({fabric, domain}).second) continue;
    out.push_back(
        {i->fabric_attr->prov_name ? i->fabric_attr->prov_name : provider, fabric, domain});
  }
  return out;
}

}  // namespace

Result<Topology> DiscoverTopology(const std::string& provider) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return Internal("hwloc_topology_init failed");
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return Internal("hwloc_topology_load failed");
  }
  Topology t;
  t.num_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  std::vector<std::pair<AcceleratorInfo, hwloc_obj_t>> accels;
  std::vector<hwloc_obj_t> nic_ancestors;
  for (hwloc_obj_t o = hwloc_get_next_osdev(topo, nullptr); o; o = hwloc_get_next_osdev(topo, o)) {
    hwloc_obj_osdev_type_t type = o->attr->osdev.type;
    Placement p = Place(topo, o);
    if (type == HWLOC_OBJ_OSDEV_NETWORK || type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      t.nics.push_back(
          {o->name ? o->name : "", type == HWLOC_OBJ_OSDEV_OPENFABRICS, p.pci, p.numa, p.cores});
      nic_ancestors.push_back(p.ancestor);
    } else if (type == HWLOC_OBJ_OSDEV_GPU || type == HWLOC_OBJ_OSDEV_COPROC) {
      AcceleratorInfo a{o->name ? o->name : "", p.pci, p.numa, p.cores, {}};
      accels.emplace_back(std::move(a), p.ancestor);
    }
  }
  // Nearest NICs of each accelerator: RDMA first, then by the depth of their common ancestor.
  for (auto& [a, anc] : accels) {
    std::vector<std::pair<std::pair<int, int>, std::string>> ranked;
    for (size_t i = 0; i < t.nics.size(); ++i) {
      hwloc_obj_t common = (anc && nic_ancestors[i])
                               ? hwloc_get_common_ancestor_obj(topo, anc, nic_ancestors[i])
                               : nullptr;
      int depth = common ? static_cast<int>(common->depth) : -1;
      ranked.push_back({{t.nics[i].rdma ? 0 : 1, -depth}, t.nics[i].name});
    }
    std::sort(ranked.begin(), ranked.end());
    for (auto& r : ranked) a.nearest_nics.push_back(r.second);
    t.accelerators.push_back(std::move(a));
  }
  hwloc_topology_destroy(topo);
  t.interfaces = ProviderInterfaces(provider);
  return t;
}

std::vector<std::string> DomainsForDevice(const Topology& t, int accelerator) {
  std::set<std::string> offered;
  for (const auto& i : t.interfaces) offered.insert(i.domain);
  std::vector<std::string> out;
  if (accelerator >= 0 && accelerator < static_cast<int>(t.accelerators.size())) {
    for (const auto& nic : t.accelerators[accelerator].nearest_nics) {
      if (offered.count(nic)) out.push_back(nic);
    }
  }
  if (out.empty()) {
    for (const auto& nic : t.nics) {
      if (nic.rdma && offered.count(nic.name)) out.push_back(nic.name);
    }
  }
  if (out.empty()) {
    for (const auto& d : offered) {
      if (d != "lo") out.push_back(d);
    }
  }
  if (out.empty() && offered.count("lo")) out.push_back("lo");
  return out;
}

}  // namespace pd::transfer
