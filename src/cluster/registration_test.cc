#include "cluster/registration.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "cluster/cluster_test_util.h"
#include "cluster/etcd_test_server.h"
#include "cluster/member.h"
#include "cluster/member_watch.h"

namespace pd::cluster {
namespace {

using testing::WaitUntil;

Member Decode(int k) {
  Member m;
  m.role = "decode";
  m.name = "d" + std::to_string(k);
  m.http_url = "http://10.0.0." + std::to_string(k) + ":8101";
  m.fabric_address = "00ff";
  m.model_fingerprint = "1234";
  m.tensor_parallel_size = 2;
  m.nics = {"eth0"};
  return m;
}

TEST(MemberTest, EncodesAndChecksItsMac) {
  const Member m = Decode(3);
  const std::string value = EncodeMember(m, "secret");
  auto back = DecodeMember(value, "secret");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->http_url, m.http_url);
  EXPECT_EQ(back->tensor_parallel_size, 2);
  EXPECT_EQ(back->nics, m.nics);
  EXPECT_NE(DecodeMember(value, "other").status().message().find("MAC"), std::string::npos);
  std::string forged = value;
  forged.replace(forged.find("8101"), 4, "9999");
  EXPECT_FALSE(DecodeMember(forged, "secret").ok());
  EXPECT_EQ(DecodeMember("{", "secret").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MemberKey("prod", m), "/pdserve/prod/decode/d3");
  EXPECT_TRUE(ValidateClusterName("prod-1.a_b").ok());
  EXPECT_NE(ValidateClusterName("a/b").message().find("'/'"), std::string::npos);
  EXPECT_FALSE(ValidateClusterName("").ok());
}

class RegistrationTest : public testing::EtcdServerTest {
 protected:
  RegistrationOptions Options(const Member& m, const std::string& secret = "s") {
    RegistrationOptions o;
    o.etcd = server_->options();
    o.key = MemberKey("c", m);
    o.value = EncodeMember(m, secret);
    o.ttl_s = 2;
    o.retry_s = 0.1;
    return o;
  }
  std::unique_ptr<MemberWatch> Watch(
      std::function<void(const std::vector<Member>&)> on_change = nullptr) {
    MemberWatchOptions o;
    o.on_change = std::move(on_change);
    o.etcd = server_->options();
    o.prefix = RolePrefix("c", "decode");
    o.secret = "s";
    o.retry_s = 0.1;
    auto w = MemberWatch::Create(o);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(w).value() : nullptr;
  }
  static bool Has(const MemberWatch& w, const std::string& name) {
    for (const Member& m : w.members())
      if (m.name == name) return true;
    return false;
  }
};

TEST_F(RegistrationTest, AWatchSeesMembersJoinDeregisterAndOutliveTheirTtl) {
  auto watch = Watch();
  ASSERT_NE(watch, nullptr);
  EXPECT_TRUE(watch->members().empty());
  auto a = Registration::Create(Options(Decode(1)));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Registration::Create(Options(Decode(2)));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(
      WaitUntil([&] { return Has(*watch, "d1") && Has(*watch, "d2"); }, std::chrono::seconds(5)));
  // Kept alive past several TTLs.
  EXPECT_FALSE(WaitUntil([&] { return !Has(*watch, "d1"); }, std::chrono::milliseconds(4500)));
  (*a)->Deregister();  // the key goes at once
  EXPECT_TRUE(WaitUntil([&] { return !Has(*watch, "d1"); }, std::chrono::seconds(1)));
  EXPECT_TRUE(Has(*watch, "d2"));
  EXPECT_EQ((*b)->registrations(), 1);
}

TEST_F(RegistrationTest, AMemberWithAnotherSecretIsIgnored) {
  auto watch = Watch();
  ASSERT_NE(watch, nullptr);
  auto forged = Registration::Create(Options(Decode(7), "wrong"));
  ASSERT_TRUE(forged.ok());
  auto real = Registration::Create(Options(Decode(8)));
  ASSERT_TRUE(real.ok());
  ASSERT_TRUE(WaitUntil([&] { return Has(*watch, "d8"); }, std::chrono::seconds(5)));
  EXPECT_FALSE(Has(*watch, "d7"));
}

TEST_F(RegistrationTest, EveryoneReRegistersAfterEtcdRestartsWithoutItsData) {
  // Once seen, d1 never leaves the published set: etcd knowing nobody for a moment after its
  // restart is bridged by the watch's rejoin grace.
  std::atomic<bool> seen{false}, lost{false};
  auto watch = Watch([&](const std::vector<Member>& members) {
    bool has = false;
    for (const Member& m : members) has |= m.name == "d1";
    if (has) seen = true;
    if (seen && !has) lost = true;
  });
  ASSERT_NE(watch, nullptr);
  auto a = Registration::Create(Options(Decode(1)));
  ASSERT_TRUE(a.ok());
  auto gone = Registration::Create(Options(Decode(2)));
  ASSERT_TRUE(gone.ok());
  ASSERT_TRUE(
      WaitUntil([&] { return Has(*watch, "d1") && Has(*watch, "d2"); }, std::chrono::seconds(5)));
  server_->Kill();
  gone->reset();  // d2's process goes while etcd is down: it never registers again
  server_->WipeData();
  ASSERT_TRUE(server_->Start().ok());
  // The lease is unknown to the new etcd: a new one, the key put again, and the watch restarted.
  EXPECT_TRUE(WaitUntil([&] { return (*a)->registrations() == 2; }, std::chrono::seconds(10)));
  EXPECT_TRUE(WaitUntil([&] { return watch->restarts() >= 1 && Has(*watch, "d1"); },
                        std::chrono::seconds(10)));
  EXPECT_TRUE(WaitUntil([&] { return !Has(*watch, "d2"); }, std::chrono::seconds(10)));
  EXPECT_FALSE(lost) << "d1 left the watched set while etcd restarted";
  EtcdClient client(server_->options());
  auto r = client.RangePrefix(RolePrefix("c", "decode"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].lease, (*a)->lease());
}

TEST_F(RegistrationTest, CreateFailsNamingEtcdWhenNothingAnswers) {
  RegistrationOptions o = Options(Decode(1));
  o.etcd.endpoints = {{"127.0.0.1", testing::FreeLoopbackPort()}};
  o.start_timeout_s = 0.3;
  auto r = Registration::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot register /pdserve/c/decode/d1 in etcd"),
            std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace pd::cluster
