#include "cluster/etcd_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "cluster/base64.h"
#include "cluster/cluster_test_util.h"
#include "cluster/etcd_test_server.h"

namespace pd::cluster {
namespace {

using testing::WaitUntil;

TEST(Base64Test, RoundTripsEveryLengthAndByte) {
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    bytes += static_cast<char>((i * 37) & 255);
    auto back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, bytes);
  }
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
}

TEST(Base64Test, RefusesMalformedText) {
  EXPECT_NE(Base64Decode("Zm9").status().message().find("multiple of 4"), std::string::npos);
  EXPECT_NE(Base64Decode("Zm!v").status().message().find("'!'"), std::string::npos);
  EXPECT_FALSE(Base64Decode("Z===").ok());
  EXPECT_FALSE(Base64Decode("Zg==Zg==").ok());  // padding only at the end
}

TEST(EtcdUrlTest, ParsesEndpointsAndNamesWhatIsWrong) {
  auto o = ParseEtcdUrl("etcd://10.0.0.5:2379,etcd-1.local:2380");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->endpoints.size(), 2u);
  EXPECT_EQ(o->endpoints[1].host, "etcd-1.local");
  EXPECT_EQ(o->endpoints[1].port, 2380);
  EXPECT_NE(ParseEtcdUrl("http://a:1").status().message().find("etcd://"), std::string::npos);
  EXPECT_NE(ParseEtcdUrl("etcd://a:99999").status().message().find("99999"), std::string::npos);
  EXPECT_FALSE(ParseEtcdUrl("etcd://").ok());
  EXPECT_FALSE(ParseEtcdUrl("etcd://hostonly").ok());
}

TEST(EtcdUrlTest, PrefixRangeEndIsThePrefixPlusOne) {
  EXPECT_EQ(PrefixRangeEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
}

class EtcdClientTest : public testing::EtcdServerTest {
 protected:
  void SetUp() override {
    EtcdServerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    client_ = std::make_unique<EtcdClient>(server_->options());
  }
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, PutRangeByPrefixAndDelete) {
  ASSERT_TRUE(client_->Put("/p/a", "1").ok());
  ASSERT_TRUE(client_->Put("/p/b", std::string("\0\xff two", 6)).ok());
  ASSERT_TRUE(client_->Put("/q/c", "3").ok());  // outside the prefix
  auto r = client_->RangePrefix("/p/");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].key, "/p/a");
  EXPECT_EQ(r->kvs[1].value, std::string("\0\xff two", 6));
  EXPECT_GT(r->revision, 0);
  ASSERT_TRUE(client_->Delete("/p/a").ok());
  r = client_->RangePrefix("/p/");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kvs.size(), 1u);
}

TEST_F(EtcdClientTest, AKeyLivesWithItsLease) {
  auto lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(client_->Put("/l/kept", "x", *lease).ok());
  auto ttl = client_->KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GE(*ttl, 1);
  ASSERT_TRUE(client_->Revoke(*lease).ok());
  auto r = client_->RangePrefix("/l/");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->kvs.empty());  // revoked: the key went with it
  EXPECT_EQ(client_->KeepAlive(*lease).status().code(), StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, AKeyWhoseLeaseIsNotKeptAliveExpires) {
  auto lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->Put("/e/k", "x", *lease).ok());
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto r = client_->RangePrefix("/e/");
        return r.ok() && r->kvs.empty();
      },
      std::chrono::seconds(6)));
  EXPECT_EQ(client_->KeepAlive(*lease).status().code(), StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, AWatchSeesPutsAndDeletesUnderItsPrefixOnly) {
  auto r = client_->RangePrefix("/w/");
  ASSERT_TRUE(r.ok());
  auto watch = client_->WatchPrefix("/w/", r->revision + 1);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(client_->Put("/other", "no").ok());
  ASSERT_TRUE(client_->Put("/w/a", "v1").ok());
  ASSERT_TRUE(client_->Delete("/w/a").ok());
  std::vector<WatchEvent> events;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (events.size() < 2 && std::chrono::steady_clock::now() < end) {
    ASSERT_TRUE((*watch)->Next(200, &events).ok());
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, "/w/a");
  EXPECT_EQ(events[0].kv.value, "v1");
  EXPECT_EQ(events[1].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(events[1].kv.key, "/w/a");
}

TEST_F(EtcdClientTest, AWatchBreaksWhenEtcdStopsAndCancelEndsItAtOnce) {
  auto watch = client_->WatchPrefix("/w/", 0);
  ASSERT_TRUE(watch.ok());
  std::thread canceller([&] { (*watch)->Cancel(); });
  std::vector<WatchEvent> events;
  Status s;
  const auto start = std::chrono::steady_clock::now();
  while (s.ok() && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    s = (*watch)->Next(1000, &events);
  }
  canceller.join();
  EXPECT_EQ(s.code(), StatusCode::kCancelled);

  auto second = client_->WatchPrefix("/w/", 0);
  ASSERT_TRUE(second.ok());
  server_->Stop();
  s = OkStatus();
  while (s.ok()) s = (*second)->Next(1000, &events);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(client_->Put("/x", "y").code(), StatusCode::kUnavailable);
}

TEST_F(EtcdClientTest, RequestsMoveOnToTheNextEndpoint) {
  EtcdOptions o = server_->options();
  o.endpoints.insert(o.endpoints.begin(), HostPort{"127.0.0.1", testing::FreeLoopbackPort()});
  EtcdClient two(o);
  ASSERT_TRUE(two.Put("/f/a", "1").ok());
  auto r = two.RangePrefix("/f/");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kvs.size(), 1u);
}

}  // namespace
}  // namespace pd::cluster
