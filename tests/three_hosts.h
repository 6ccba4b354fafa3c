// Three network namespaces ("hosts" 0, 1, 2) on one bridge in the test's own namespace, which has
// an address on it too, for the tests that run a cluster across hosts (header-only). Needs root
// and `ip` (iproute2); Create says why not otherwise. Everything created is deleted on destruction.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tests/two_hosts.h"  // IpBinary

namespace pd::testing {

class ThreeHosts {
 public:
  static constexpr int kHosts = 3;

  static std::unique_ptr<ThreeHosts> Create(std::string* why_not) {
    if (geteuid() != 0) {
      *why_not = "needs root to create network namespaces, veth pairs and a bridge";
      return nullptr;
    }
    std::unique_ptr<ThreeHosts> h(new ThreeHosts());
    h->ip_ = IpBinary();
    if (h->ip_.empty()) {
      *why_not = "needs `ip` (iproute2), which is not installed";
      return nullptr;
    }
    const std::string id = std::to_string(getpid() % 100000);
    const std::string subnet = "10.233." + std::to_string(getpid() % 250) + ".";
    h->bridge_ = "pdbr" + id;
    h->root_addr_ = subnet + "254";
    std::vector<std::string> cmds = {"link add " + h->bridge_ + " type bridge",
                                     "addr add " + h->root_addr_ + "/24 dev " + h->bridge_,
                                     "link set " + h->bridge_ + " up"};
    for (int k = 0; k < kHosts; ++k) {
      const std::string ns = "pdh" + std::to_string(k) + "_" + id;
      const std::string out = "pdv" + std::to_string(k) + "o" + id;  // bridge side
      const std::string in = "pdv" + std::to_string(k) + "i" + id;
      h->ns_.push_back(ns);
      h->addr_.push_back(subnet + std::to_string(k + 1));
      cmds.insert(
          cmds.end(),
          {"netns add " + ns, "link add " + out + " type veth peer name " + in + " netns " + ns,
           "link set " + out + " master " + h->bridge_, "link set " + out + " up",
           "-n " + ns + " addr add " + h->addr_.back() + "/24 dev " + in,
           "-n " + ns + " link set " + in + " up", "-n " + ns + " link set lo up"});
    }
    for (const std::string& cmd : cmds) {
      if (std::system((h->ip_ + " " + cmd + " >/dev/null 2>&1").c_str()) != 0) {
        *why_not = "cannot set up network namespaces (`ip " + cmd + "` failed)";
        return nullptr;  // ~ThreeHosts deletes what was created
      }
    }
    return h;
  }
  ~ThreeHosts() {
    for (const std::string& ns : ns_) {
      (void)std::system((ip_ + " netns del " + ns + " >/dev/null 2>&1").c_str());
    }
    if (!bridge_.empty()) {
      (void)std::system((ip_ + " link del " + bridge_ + " >/dev/null 2>&1").c_str());
    }
  }

  // argv that runs `args` inside host k's namespace.
  std::vector<std::string> In(int k, const std::vector<std::string>& args) const {
    std::vector<std::string> a = {ip_, "netns", "exec", ns_[k]};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  const std::string& addr(int k) const { return addr_[k]; }
  // The test's own address on the bridge (it reaches every host).
  const std::string& root_addr() const { return root_addr_; }

 private:
  ThreeHosts() = default;
  std::string ip_, bridge_, root_addr_;
  std::vector<std::string> ns_, addr_;
};

}  // namespace pd::testing
