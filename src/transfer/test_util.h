// Helpers shared by the transfer tests (header-only so it is not part of pd_transfer).
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include "transfer/domain.h"

namespace pd::transfer::testing {

// Loopback domain options with short deadlines, so failure tests stay fast.
inline DomainOptions LoopbackOptions() {
  DomainOptions o;
  o.node = "127.0.0.1";
  o.op_timeout_s = 5.0;
  return o;
}

// Creates a domain or explains why the test cannot run here.
#define PD_CREATE_DOMAIN_OR_SKIP(var, options)                                              \
  auto var##_result = ::pd::transfer::Domain::Create(options);                              \
  if (!var##_result.ok()) {                                                                 \
    GTEST_SKIP() << "libfabric provider unavailable: " << var##_result.status().ToString(); \
  }                                                                                         \
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
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
      status_ = s;
      cv_.notify_all();
    };
  }
  std::optional<Status> Wait(double timeout_s = 30.0) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return calls_ > 0; });
    return status_;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  std::optional<Status> status_;
};

}  // namespace pd::transfer::testing
