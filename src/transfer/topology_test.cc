#include "transfer/topology.h"

#include <gtest/gtest.h>

namespace pd::transfer {
namespace {

TEST(TopologyTest, FindsCoresNicsAndProviderInterfaces) {
  auto t = DiscoverTopology("tcp;ofi_rxm");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_GE(t->num_cores, 1);
  for (const auto& nic : t->nics) {
    EXPECT_FALSE(nic.name.empty());
    EXPECT_FALSE(nic.cores.empty()) << nic.name;
    for (int c : nic.cores) EXPECT_LT(c, 1 << 16);
  }
  if (t->interfaces.empty()) GTEST_SKIP() << "provider tcp;ofi_rxm offers no interface here";
  bool has_lo = false;
  for (const auto& i : t->interfaces) has_lo |= i.domain == "lo";
  EXPECT_TRUE(has_lo);
  auto domains = DomainsForDevice(*t, -1);
  ASSERT_FALSE(domains.empty());
  for (const auto& d : domains) {
    bool offered = false;
    for (const auto& i : t->interfaces) offered |= i.domain == d;
    EXPECT_TRUE(offered) << d;
  }
}

TEST(TopologyTest, PrefersTheAcceleratorsNearestRdmaNicThatTheProviderOffers) {
  Topology t;
  t.num_cores = 8;
  t.nics = {{"eth0", false, "0000:01:00.0", 0, {0, 1}},
            {"mlx5_0", true, "0000:3b:00.0", 0, {0, 1}},
            {"mlx5_1", true, "0000:af:00.0", 1, {2, 3}}};
  t.accelerators = {{"cuda0", "0000:b0:00.0", 1, {2, 3}, {"mlx5_1", "mlx5_0", "eth0"}}};
  t.interfaces = {{"verbs;ofi_rxm", "IB-0xfe80", "mlx5_0"},
                  {"verbs;ofi_rxm", "IB-0xfe80", "mlx5_1"}};
  EXPECT_EQ(DomainsForDevice(t, 0), (std::vector<std::string>{"mlx5_1", "mlx5_0"}));
  EXPECT_EQ(DomainsForDevice(t, -1), (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  t.interfaces = {{"tcp;ofi_rxm", "127.0.0.1/32", "lo"}, {"tcp;ofi_rxm", "10.0.0.0/24", "eth0"}};
  EXPECT_EQ(DomainsForDevice(t, 0), (std::vector<std::string>{"eth0"}));
  t.interfaces = {{"tcp;ofi_rxm", "127.0.0.1/32", "lo"}};
  EXPECT_EQ(DomainsForDevice(t, 0), (std::vector<std::string>{"lo"}));
}

}  // namespace
}  // namespace pd::transfer
