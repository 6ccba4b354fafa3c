// Test helper (header-only): a real etcd server (Debian's etcd-server) on free loopback ports with
// a temporary data directory, which a test can stop, restart (with its data or without) and
// delete. Tests call Find() first and GTEST_SKIP with its reason when the binary is absent.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.h"
#include "common/subprocess.h"

namespace pd::cluster::testing {

// A loopback port nothing listens on now (bound, read back, closed).
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

class EtcdServer {
 public:
  // The etcd binary, or "" with *why_not set.
  static std::string Find(std::string* why_not) {
    for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
      if (::access(p, X_OK) == 0) return p;
    }
    *why_not = "needs the etcd binary (Debian package etcd-server; scripts/install-deps.sh)";
    return "";
  }

  // `listen_host`: the address clients reach it on (127.0.0.1, or a namespace's address).
  explicit EtcdServer(std::string binary, std::string listen_host = "127.0.0.1")
      : binary_(std::move(binary)), host_(std::move(listen_host)) {
    dir_ = (std::filesystem::temp_directory_path() /
            ("pd_etcd_" + std::to_string(::getpid()) + "_" + std::to_string(Counter()++)))
               .string();
    client_port_ = FreeLoopbackPort();
    peer_port_ = FreeLoopbackPort();
  }
  ~EtcdServer() {
    Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Starts etcd (wrapped by `wrap`, e.g. "ip netns exec NS") and waits until it answers.
  Status Start(const std::vector<std::string>& wrap = {}) {
    const std::string client = "http://" + host_ + ":" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    SubprocessOptions o;
    o.argv = wrap;
    for (const std::string& a :
         {binary_, std::string("--name"), std::string("pdtest"), std::string("--data-dir"),
          dir_ + "/data", std::string("--listen-client-urls"), client,
          std::string("--advertise-client-urls"), client, std::string("--listen-peer-urls"), peer,
          std::string("--initial-advertise-peer-urls"), peer, std::string("--initial-cluster"),
          "pdtest=" + peer, std::string("--logger"), std::string("zap"), std::string("--log-level"),
          std::string("error")}) {
      o.argv.push_back(a);
    }
    std::filesystem::create_directories(dir_);
    log_fd_ = ::open((dir_ + "/etcd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    o.stdout_fd = log_fd_;
    o.stderr_fd = log_fd_;
    ASSIGN_OR_RETURN(process_, Subprocess::Spawn(o));
    EtcdClient client_api(options());
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!client_api.RangePrefix("/").ok()) {
      Result<std::optional<ExitStatus>> exited = process_.Poll();
      if (std::chrono::steady_clock::now() > end || !exited.ok() || exited->has_value()) {
        return Unavailable("etcd did not start (see " + dir_ + "/etcd.log)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return OkStatus();
  }
  void Stop() {
    if (process_.running()) (void)process_.Terminate(std::chrono::seconds(5));
    if (log_fd_ >= 0) ::close(log_fd_);
    log_fd_ = -1;
  }
  void Kill() {
    if (process_.running()) (void)process_.Kill();
  }
  // Forgets every key and lease (a fresh member, as one whose volume was lost).
  void WipeData() {
    std::error_code ec;
    std::filesystem::remove_all(dir_ + "/data", ec);
  }

  EtcdOptions options() const {
    EtcdOptions o;
    o.endpoints.push_back({host_, client_port_});
    o.timeout_ms = 1000;
    return o;
  }
  std::string url() const { return "etcd://" + host_ + ":" + std::to_string(client_port_); }
  int client_port() const { return client_port_; }

 private:
  static int& Counter() {
    static int n = 0;
    return n;
  }
  std::string binary_, host_, dir_;
  int client_port_ = 0, peer_port_ = 0;
  int log_fd_ = -1;
  Subprocess process_;
};

}  // namespace pd::cluster::testing
