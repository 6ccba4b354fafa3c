// Test helper (header-only, not part of pd_transfer): runs the other side of a transfer in a
// separate OS process. The test binary re-executes itself with PD_TRANSFER_PEER_FD set; a static
// hook in the test file then runs PeerMain instead of the tests. Parent and peer talk over a
// socketpair in frames of "header\n" + binary payload.
//
// Peer commands: "peer" + fabric address (control messages are echoed back to it), "expect <imm>
// <count>" (the peer answers "fired <imm> <received>" when its imm counter fires), "dump" (the peer
// answers with its whole region), "exit". At start the peer sends "desc" + its region's descriptor.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/subprocess.h"
#include "transfer/domain.h"
#include "transfer/test_util.h"

namespace pd::transfer::testing {

inline bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

inline bool WriteFrame(int fd, std::string_view header, std::string_view payload = {}) {
  std::string body = std::string(header) + "\n" + std::string(payload);
  uint64_t len = body.size();
  return WriteAll(fd, reinterpret_cast<const char*>(&len), 8) &&
         WriteAll(fd, body.data(), body.size());
}

inline bool ReadAll(int fd, char* p, size_t n, double timeout_s) {
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(timeout_s * 1000)) <= 0) return false;
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct Frame {
  std::string header;
  std::string payload;
};

inline std::optional<Frame> ReadFrame(int fd, double timeout_s = 30.0) {
  uint64_t len = 0;
  if (!ReadAll(fd, reinterpret_cast<char*>(&len), 8, timeout_s)) return std::nullopt;
  std::string body(len, '\0');
  if (!ReadAll(fd, body.data(), len, timeout_s)) return std::nullopt;
  size_t nl = body.find('\n');
  if (nl == std::string::npos) return std::nullopt;
  return Frame{body.substr(0, nl), body.substr(nl + 1)};
}

// The peer's main loop; returns its exit code.
inline int PeerMain(int fd) {
  if (const char* ns = getenv("PD_TRANSFER_PEER_NETNS")) {
    int nsfd = open(ns, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) return 3;
    close(nsfd);
  }
  DomainOptions o;
  o.node = getenv("PD_TRANSFER_PEER_NODE") ? getenv("PD_TRANSFER_PEER_NODE") : "127.0.0.1";
  std::mutex mu;
  auto reply = [&](std::string_view header, std::string_view payload = {}) {
    std::lock_guard<std::mutex> lock(mu);
    WriteFrame(fd, header, payload);
  };
  std::unique_ptr<Domain> domain;
  PeerAddr parent;
  o.on_message = [&](std::string_view m) {
    (void)domain->SubmitSend(parent, "echo:" + std::string(m), nullptr);
  };
  auto created = Domain::Create(o);
  if (!created.ok()) {
    reply("error", created.status().ToString());
    return 1;
  }
  domain = std::move(created).value();
  size_t size = getenv("PD_TRANSFER_PEER_BYTES") ? strtoull(getenv("PD_TRANSFER_PEER_BYTES"), 0, 10)
                                                 : size_t{8} << 20;
  Mapping region(size);
  region.Fill('\x5c');
  auto mr = domain->RegisterMemory(region.data(), region.size());
  if (!mr.ok()) {
    reply("error", mr.status().ToString());
    return 1;
  }
  reply("desc", mr->descriptor.ToBytes());
  while (auto frame = ReadFrame(fd, 600.0)) {
    if (frame->header == "peer") {
      auto p = domain->AddPeer(frame->payload);
      if (p.ok()) parent = *p;
    } else if (frame->header.rfind("expect ", 0) == 0) {
      unsigned imm = 0;
      unsigned long long count = 0;
      sscanf(frame->header.c_str(), "expect %u %llu", &imm, &count);
      auto w = domain->imm_counters().Expect(imm, count, [&reply, imm, count] {
        reply("fired " + std::to_string(imm) + " " + std::to_string(count));
      });
      if (!w.ok()) reply("error", w.status().ToString());
    } else if (frame->header == "dump") {
      reply("region", std::string_view(region.data(), region.size()));
    } else if (frame->header == "exit") {
      break;
    }
  }
  domain.reset();
  return 0;
}

// Registers the hook: call from a static initialiser in the test file.
inline bool RunPeerIfRequested() {
  const char* fd = getenv("PD_TRANSFER_PEER_FD");
  if (fd == nullptr) return false;
  _exit(PeerMain(atoi(fd)));
}

// The parent's handle on a peer process (a Subprocess: killed and reaped on destruction).
class PeerProcess {
 public:
  // `env` adds PD_TRANSFER_PEER_* variables for the peer. Null when it cannot start.
  static std::unique_ptr<PeerProcess> Spawn(const std::map<std::string, std::string>& env = {}) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
    SubprocessOptions o;
    o.path = "/proc/self/exe";  // this test binary, whose static hook runs PeerMain
    o.argv = {"transfer-peer"};
    o.env.assign(env.begin(), env.end());
    o.env.emplace_back("PD_TRANSFER_PEER_FD", std::to_string(sv[1]));
    o.inherit_fds = {sv[1]};
    Result<Subprocess> process = Subprocess::Spawn(o);
    close(sv[1]);
    if (!process.ok()) {
      close(sv[0]);
      return nullptr;
    }
    auto p = std::unique_ptr<PeerProcess>(new PeerProcess());
    p->process_ = std::move(process).value();
    p->fd_ = sv[0];
    return p;
  }
  ~PeerProcess() {
    (void)process_.Kill();
    close(fd_);
  }
  bool Send(std::string_view header, std::string_view payload = {}) {
    return WriteFrame(fd_, header, payload);
  }
  std::optional<Frame> Receive(double timeout_s = 30.0) { return ReadFrame(fd_, timeout_s); }
  // Stops the peer and returns once the kernel reports it stopped.
  void Stop() { (void)process_.Suspend(); }
  void Continue() { (void)process_.Resume(); }
  void Kill() { (void)process_.Kill(); }
  // Asks the peer to exit and returns its exit code (-1 if it died otherwise or does not exit).
  int Exit() {
    Send("exit");
    Result<ExitStatus> status = process_.Wait(std::chrono::seconds(60));
    return status.ok() && status->signal == 0 ? status->code : -1;
  }

 private:
  PeerProcess() = default;
  Subprocess process_;
  int fd_ = -1;
};

}  // namespace pd::transfer::testing

namespace pd::transfer::testing {

// Two network namespaces joined by a veth pair (10.231.x.1 <-> 10.231.x.2), standing in for two
// hosts. Needs root; Create explains why when it cannot build them. Removed on destruction.
class NetnsPair {
 public:
  static std::unique_ptr<NetnsPair> Create(std::string* why_not) {
    if (geteuid() != 0) {
      *why_not = "needs root to create network namespaces and a veth pair";
      return nullptr;
    }
    auto p = std::unique_ptr<NetnsPair>(new NetnsPair());
    std::string id = std::to_string(getpid() % 100000);
    p->a_ = "pdtA" + id;
    p->b_ = "pdtB" + id;
    std::string subnet = "10.231." + std::to_string(getpid() % 250) + ".";
    p->addr_a_ = subnet + "1";
    p->addr_b_ = subnet + "2";
    std::string va = "pdva" + id, vb = "pdvb" + id;
    const std::string cmds[] = {
        "ip netns add " + p->a_,
        "ip netns add " + p->b_,
        "ip link add " + va + " netns " + p->a_ + " type veth peer name " + vb + " netns " + p->b_,
        "ip -n " + p->a_ + " addr add " + p->addr_a_ + "/24 dev " + va,
        "ip -n " + p->b_ + " addr add " + p->addr_b_ + "/24 dev " + vb,
        "ip -n " + p->a_ + " link set " + va + " up",
        "ip -n " + p->b_ + " link set " + vb + " up",
        "ip -n " + p->a_ + " link set lo up",
        "ip -n " + p->b_ + " link set lo up",
    };
    for (const std::string& cmd : cmds) {
      if (system((cmd + " 2>/dev/null").c_str()) != 0) {
        *why_not = "cannot set up network namespaces (`" + cmd + "` failed)";
        return nullptr;
      }
    }
    return p;
  }
  ~NetnsPair() {
    system(("ip netns del " + a_ + " 2>/dev/null").c_str());
    system(("ip netns del " + b_ + " 2>/dev/null").c_str());
  }
  std::string path_a() const { return "/var/run/netns/" + a_; }
  std::string path_b() const { return "/var/run/netns/" + b_; }
  const std::string& addr_a() const { return addr_a_; }
  const std::string& addr_b() const { return addr_b_; }

  // Runs fn with the calling thread in namespace A; threads it starts (a domain's worker) stay
  // there. The thread returns to its own namespace afterwards.
  template <typename Fn>
  bool InNamespaceA(Fn&& fn) {
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int ns = open(path_a().c_str(), O_RDONLY | O_CLOEXEC);
    bool ok = self >= 0 && ns >= 0 && setns(ns, CLONE_NEWNET) == 0;
    if (ok) fn();
    if (self >= 0) ok = setns(self, CLONE_NEWNET) == 0 && ok;
    if (self >= 0) close(self);
    if (ns >= 0) close(ns);
    return ok;
  }

 private:
  NetnsPair() = default;
  std::string a_, b_, addr_a_, addr_b_;
};

}  // namespace pd::transfer::testing
