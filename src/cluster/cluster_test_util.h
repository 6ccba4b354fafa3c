// Test helpers (header-only) shared by the cluster tests: a fixture with a running etcd server,
// and a poll with a deadline.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "cluster/etcd_test_server.h"

namespace pd::cluster::testing {

// A started etcd server in server_; skips, saying why, where the etcd binary is absent.
class EtcdServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    const std::string bin = EtcdServer::Find(&why);
    if (bin.empty()) GTEST_SKIP() << why;
    server_ = std::make_unique<EtcdServer>(bin);
    ASSERT_TRUE(server_->Start().ok());
  }
  std::unique_ptr<EtcdServer> server_;
};

// Polls `cond` every 10 ms until it holds (true) or `timeout` has passed (false). For conditions
// that another process (etcd) or thread changes without a signal to wait on.
inline bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace pd::cluster::testing
