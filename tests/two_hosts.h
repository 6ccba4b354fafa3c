// Two network namespaces ("prefill host" A and "decode host" B) joined by a veth pair (or several:
// one subnet each, like hosts with several NICs), for the tests that run instances on two hosts
// (header-only). Needs root and `ip` (iproute2); Create
// says why not otherwise. Everything created is deleted on destruction.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace pd::testing {

inline std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// Two namespaces ("prefill host" and "decode host") joined by a veth pair, deleted on
// destruction (whatever was created of them).
class TwoHosts {
 public:
  // `links` veth pairs (1 to 4), pair k on subnet 10.(232+k).x.0/24.
  static std::unique_ptr<TwoHosts> Create(std::string* why_not, int links = 1) {
    if (geteuid() != 0) {
      *why_not = "needs root to create network namespaces and a veth pair";
      return nullptr;
    }
    const std::string ip = IpBinary();
    if (ip.empty()) {
      *why_not = "needs `ip` (iproute2), which is not installed";
      return nullptr;
    }
    std::unique_ptr<TwoHosts> h(new TwoHosts());
    h->ip_ = ip;
    const std::string id = std::to_string(getpid() % 100000);
    h->a_ = "pdfA" + id;
    h->b_ = "pdfB" + id;
    std::vector<std::string> cmds = {"netns add " + h->a_, "netns add " + h->b_,
                                     "-n " + h->a_ + " link set lo up",
                                     "-n " + h->b_ + " link set lo up"};
    for (int k = 0; k < links; ++k) {
      const std::string subnet =
          "10." + std::to_string(232 + k) + "." + std::to_string(getpid() % 250) + ".";
      const std::string va = "pdf" + std::to_string(k) + "a" + id;
      const std::string vb = "pdf" + std::to_string(k) + "b" + id;
      h->addr_a_.push_back(subnet + "1");
      h->addr_b_.push_back(subnet + "2");
      h->veth_a_.push_back(va);
      cmds.insert(cmds.end(),
                  {
                      "link add " + va + " netns " + h->a_ + " type veth peer name " + vb +
                          " netns " + h->b_,
                      "-n " + h->a_ + " addr add " + h->addr_a_.back() + "/24 dev " + va,
                      "-n " + h->b_ + " addr add " + h->addr_b_.back() + "/24 dev " + vb,
                      "-n " + h->a_ + " link set " + va + " up",
                      "-n " + h->b_ + " link set " + vb + " up",
                  });
    }
    for (const std::string& cmd : cmds) {
      if (std::system((ip + " " + cmd + " >/dev/null 2>&1").c_str()) != 0) {
        *why_not = "cannot set up network namespaces (`ip " + cmd + "` failed)";
        return nullptr;  // ~TwoHosts deletes what was created
      }
    }
    return h;
  }
  ~TwoHosts() {
    for (const std::string& ns : {a_, b_}) {
      if (!ns.empty()) (void)std::system((ip_ + " netns del " + ns + " >/dev/null 2>&1").c_str());
    }
  }

  // argv that runs `args` inside the prefill (A) or decode (B) namespace.
  std::vector<std::string> InA(const std::vector<std::string>& args) const { return In(a_, args); }
  std::vector<std::string> InB(const std::vector<std::string>& args) const { return In(b_, args); }
  // Host A's and B's address on veth pair `link`.
  const std::string& addr_a(int link = 0) const { return addr_a_.at(static_cast<size_t>(link)); }
  const std::string& addr_b(int link = 0) const { return addr_b_.at(static_cast<size_t>(link)); }

  // Runs fn on a thread that has entered namespace B (the decode host) or A; false if setns
  // failed.
  bool RunInB(const std::function<void()>& fn) const { return RunIn(b_, fn); }
  bool RunInA(const std::function<void()>& fn) const { return RunIn(a_, fn); }
  // Enters namespace B on the calling thread (a thread of the test's own); false if it failed.
  bool EnterB() const { return Enter(b_); }

  // Takes veth pair `link` down on host A's side (a partition of that link: nothing passes) or up
  // again.
  bool SetLink(bool up, int link = 0) const {
    const std::string cmd = ip_ + " -n " + a_ + " link set " +
                            veth_a_.at(static_cast<size_t>(link)) + (up ? " up" : " down");
    return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
  }

 private:
  TwoHosts() = default;
  std::vector<std::string> In(const std::string& ns, const std::vector<std::string>& args) const {
    std::vector<std::string> a = {ip_, "netns", "exec", ns};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  static bool Enter(const std::string& ns) {
    const int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return ok;
  }
  static bool RunIn(const std::string& ns, const std::function<void()>& fn) {
    bool ok = false;
    std::thread t([&] {
      ok = Enter(ns);
      if (ok) fn();
    });
    t.join();
    return ok;
  }
  std::string ip_, a_, b_;
  std::vector<std::string> addr_a_, addr_b_, veth_a_;  // per veth pair
};

}  // namespace pd::testing
