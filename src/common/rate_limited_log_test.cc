#include "common/rate_limited_log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <memory>
#include <sstream>

namespace pd {
namespace {

TEST(RateLimitedLogTest, OneLinePerKeyPerIntervalThenCountsSuppressed) {
  SimClock clock;
  RateLimitedLog limiter({.interval_s = 10.0, .max_keys = 16}, clock);
  uint64_t suppressed = 99;
  EXPECT_TRUE(limiter.ShouldLog("a", &suppressed));
  EXPECT_EQ(suppressed, 0u);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.ShouldLog("a", &suppressed));
  EXPECT_TRUE(limiter.ShouldLog("b", &suppressed)) << "another key is limited on its own";
  clock.Advance(9.9);
  EXPECT_FALSE(limiter.ShouldLog("a", &suppressed));
  clock.Advance(0.2);
  EXPECT_TRUE(limiter.ShouldLog("a", &suppressed));
  EXPECT_EQ(suppressed, 6u);
  EXPECT_FALSE(limiter.ShouldLog("a", &suppressed));
  EXPECT_EQ(limiter.total_suppressed(), 7u);
}

TEST(RateLimitedLogTest, KeyTableIsBoundedForgettingTheOldest) {
  SimClock clock;
  RateLimitedLog limiter({.interval_s = 100.0, .max_keys = 3}, clock);
  uint64_t suppressed = 0;
  for (const char* key : {"k0", "k1", "k2"}) {
    EXPECT_TRUE(limiter.ShouldLog(key, &suppressed));
    clock.Advance(1.0);
  }
  EXPECT_TRUE(limiter.ShouldLog("k3", &suppressed));
  EXPECT_EQ(limiter.num_keys(), 3u);
  EXPECT_FALSE(limiter.ShouldLog("k1", &suppressed)) << "k1 is still remembered";
  EXPECT_TRUE(limiter.ShouldLog("k0", &suppressed)) << "k0 was the oldest and was forgotten";
}

TEST(RateLimitedLogTest, MacroWritesOneLineWithTheSuppressedCount) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("rl_test", sink));
  SimClock clock;
  RateLimitedLog limiter({.interval_s = 5.0, .max_keys = 8}, clock);
  int formatted = 0;
  auto count = [&] { return ++formatted; };
  for (int i = 0; i < 4; ++i) PD_LOG_WARN_LIMITED(limiter, "peer", "bad frame {}", count());
  clock.Advance(6.0);
  PD_LOG_WARN_LIMITED(limiter, "peer", "bad frame {}", count());
  spdlog::set_default_logger(previous);
  EXPECT_EQ(formatted, 2) << "suppressed lines are not even formatted";
  const std::string text = out.str();
  EXPECT_NE(text.find("bad frame 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("bad frame 2 (3 suppressed)"), std::string::npos) << text;
}

TEST(RateLimitedLogTest, EachMacroSiteHasItsOwnLimiter) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("rl_test2", sink));
  for (int i = 0; i < 3; ++i) {
    PD_LOG_WARN_EVERY_N_SEC(3600, "k", "site one {}", i);
    PD_LOG_WARN_EVERY_N_SEC(3600, "k", "site two {}", i);
  }
  spdlog::set_default_logger(previous);
  const std::string text = out.str();
  EXPECT_NE(text.find("site one 0"), std::string::npos) << text;
  EXPECT_NE(text.find("site two 0"), std::string::npos) << text;
  EXPECT_EQ(text.find("site one 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("site two 2"), std::string::npos) << text;
}

}  // namespace
}  // namespace pd
