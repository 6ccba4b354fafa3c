#include "engine/preempt_yield.h"

#include <gtest/gtest.h>

namespace pd::engine {
namespace {

TEST(YieldAfterPreemptionTest, YieldsOnlyAfterTheCountGrew) {
  int64_t count = 5;
  int yields = 0;
  YieldAfterPreemption y([&] { return count; }, [&] { ++yields; });
  EXPECT_FALSE(y.Check());  // unchanged since construction
  EXPECT_EQ(yields, 0);
  count = 7;
  EXPECT_TRUE(y.Check());
  EXPECT_EQ(yields, 1);
  EXPECT_FALSE(y.Check());  // no further switch
  count = 8;
  EXPECT_TRUE(y.Check());
  EXPECT_EQ(yields, 2);
  EXPECT_EQ(y.yields(), 2);
}

TEST(YieldAfterPreemptionTest, ASwitchCountedByTheYieldItselfDoesNotTriggerTheNext) {
  int64_t count = 0;
  int yields = 0;
  YieldAfterPreemption y([&] { return count; },
                         [&] {
                           ++yields;
                           ++count;  // the kernel may count the yield as an involuntary switch
                         });
  count = 1;
  EXPECT_TRUE(y.Check());
  EXPECT_FALSE(y.Check());
  EXPECT_EQ(yields, 1);
}

TEST(YieldAfterPreemptionTest, YieldsAfterDeliveredOutputsWithoutAPreemption) {
  int64_t count = 2;
  int yields = 0;
  YieldAfterPreemption y([&] { return count; }, [&] { ++yields; });
  EXPECT_TRUE(y.Check(/*delivered=*/true));
  EXPECT_EQ(yields, 1);
  EXPECT_FALSE(y.Check(/*delivered=*/false));
  EXPECT_EQ(yields, 1);
  count = -1;  // the count unavailable: delivered outputs still yield
  EXPECT_TRUE(y.Check(/*delivered=*/true));
  EXPECT_EQ(yields, 2);
  EXPECT_EQ(y.yields(), 2);
}

TEST(YieldAfterPreemptionTest, AnUnavailableCountNeverYieldsWithoutOutputs) {
  int64_t count = -1;
  int yields = 0;
  YieldAfterPreemption y([&] { return count; }, [&] { ++yields; });
  EXPECT_FALSE(y.Check());
  count = 3;  // first valid reading after failures: nothing to compare with
  EXPECT_FALSE(y.Check());
  count = -1;
  EXPECT_FALSE(y.Check());
  EXPECT_EQ(yields, 0);
}

TEST(ThreadInvoluntarySwitchesTest, ReadsTheCallingThreadsCount) {
  const int64_t a = ThreadInvoluntarySwitches();
  ASSERT_GE(a, 0);
  EXPECT_GE(ThreadInvoluntarySwitches(), a);  // a count never goes down
}

}  // namespace
}  // namespace pd::engine
