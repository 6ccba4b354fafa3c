#include "transfer/poll_policy.h"

#include <gtest/gtest.h>

namespace pd::transfer {
namespace {

using P = NoWaitObjectPoll;

TEST(NoWaitObjectPollTest, YieldsRightAfterActivity) {
  for (int i = 0; i < P::kYieldNaps; ++i) EXPECT_EQ(P::NapUs(i), 0) << i;
}

TEST(NoWaitObjectPollTest, ThenDoublesFromTheFirstNapUpToTheMax) {
  EXPECT_EQ(P::NapUs(P::kYieldNaps), 20);
  EXPECT_EQ(P::NapUs(P::kYieldNaps + 1), 40);
  EXPECT_EQ(P::NapUs(P::kYieldNaps + 2), 80);
  EXPECT_EQ(P::NapUs(P::kYieldNaps + 5), 640);
  EXPECT_EQ(P::NapUs(P::kYieldNaps + 6), P::kMaxNapUs);  // 1280 capped
  EXPECT_EQ(P::NapUs(1000000), P::kMaxNapUs);            // an idle worker: no overflow
}

TEST(NoWaitObjectPollTest, NeverShrinksWhileIdle) {
  for (int i = 1; i < 100; ++i) EXPECT_GE(P::NapUs(i), P::NapUs(i - 1)) << i;
}

}  // namespace
}  // namespace pd::transfer
