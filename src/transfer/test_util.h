// Helpers shared by the transfer tests (header-only so it is not part of pd_transfer).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include "common/mutex.h"
#include "transfer/domain.h"

namespace pd::transfer::testing {

// Loopback domain options with short deadlines, so failure tests stay fast.
inline DomainOptions LoopbackOptions() {
  DomainOptions o;
  o.node = "127.0.0.1";
  o.op_timeout_s = 5.0;
  return o;
}

// Whether `s`, a Domain::Create / DomainGroup::Create (or messenger Create) error, says the
// provider is absent here: fi_getinfo found no matching provider (FI_ENODATA, NotFound). The only
// reason a fabric test may skip; any other Create error is a test failure.
inline bool ProviderAbsent(const Status& s) {
  return s.code() == StatusCode::kNotFound && s.message().find("fi_getinfo") != std::string::npos;
}

// In a void function (a test body, SetUp): skips when `status` says the provider is absent,
// fails (and returns) on any other error.
#define PD_SKIP_IF_ABSENT_ELSE_FAIL(status)                                                      \
  do {                                                                                           \
    const ::pd::Status pd_create_status_ = (status);                                             \
    if (::pd::transfer::testing::ProviderAbsent(pd_create_status_)) {                            \
      GTEST_SKIP() << "libfabric provider unavailable: " << pd_create_status_.ToString();        \
    }                                                                                            \
    GTEST_FAIL() << "Create failed (the provider is present): " << pd_create_status_.ToString(); \
  } while (0)

// Creates a domain, or skips where the provider is absent (fails on any other error).
#define PD_CREATE_DOMAIN_OR_SKIP(var, options)                                \
  auto var##_result = ::pd::transfer::Domain::Create(options);                \
  if (!var##_result.ok()) PD_SKIP_IF_ABSENT_ELSE_FAIL(var##_result.status()); \
  std::unique_ptr<::pd::transfer::Domain> var = std::move(var##_result).value()

// An anonymous shared mapping (like the memfd-backed KV regions), unmapped on destruction.
class Mapping {
 public:
  explicit Mapping(size_t size) : size_(size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    PD_CHECK(p != MAP_FAILED) << "mmap " << size;
    data_ = static_cast<char*>(p);
  }
  ~Mapping() { munmap(data_, size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return data_; }
  size_t size() const { return size_; }
  void FillRandom(uint32_t seed) {
    std::mt19937 rng(seed);
    for (size_t i = 0; i < size_; ++i) data_[i] = static_cast<char>(rng());
  }
  void Fill(char c) { std::memset(data_, c, size_); }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// Collects one completion; Wait blocks (with a generous deadline so a bug fails instead of
// hanging) until it arrives.
class Done {
 public:
  Completion Callback() {
    return [this](const Status& s) {
      MutexLock lock(&mu_);
      ++calls_;
      status_ = s;
      cv_.SignalAll();
    };
  }
  std::optional<Status> Wait(double timeout_s = 30.0) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::ceil<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(timeout_s));
    while (calls_ == 0) {
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    return status_;
  }
  int calls() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return calls_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int calls_ GUARDED_BY(mu_) = 0;
  std::optional<Status> status_ GUARDED_BY(mu_);
};

// A TCP listener on loopback that never accepts: the fabric connects at the TCP level and then
// hears nothing, like a peer that hung (the fabric connection is never set up). Transfers to it
// stall until cancelled or timed out.
class SilentPeer {
 public:
  SilentPeer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    PD_CHECK(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    PD_CHECK(listen(fd_, 16) == 0);
    socklen_t len = sizeof(addr_);
    PD_CHECK(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr_), &len) == 0);
  }
  ~SilentPeer() { close(fd_); }
  SilentPeer(const SilentPeer&) = delete;
  SilentPeer& operator=(const SilentPeer&) = delete;
  // The listener's address as a fabric address of `bytes` bytes (zero-padded).
  std::string FabricAddr(size_t bytes) const {
    std::string a(reinterpret_cast<const char*>(&addr_), sizeof(addr_));
    a.resize(bytes, '\0');
    return a;
  }
  // A 1 MiB remote region "owned" by the silent peer.
  MemoryDescriptor Descriptor(size_t fabric_addr_bytes) const {
    MemoryDescriptor d;
    d.length = 1 << 20;
    d.rkey = 1;
    d.has_key = true;
    d.fabric_addr = FabricAddr(fabric_addr_bytes);
    return d;
  }

 private:
  int fd_ = -1;
  sockaddr_in addr_{};
};

}  // namespace pd::transfer::testing
