#include "server/auth.h"

#include <gtest/gtest.h>

#include <string>

namespace pd::server {
namespace {

TEST(AuthTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("sk-abc123", "sk-abc123"));
  EXPECT_FALSE(ConstantTimeEquals("sk-abc124", "sk-abc123"));           // last byte
  EXPECT_FALSE(ConstantTimeEquals("tk-abc123", "sk-abc123"));           // first byte
  EXPECT_FALSE(ConstantTimeEquals("sk-abc", "sk-abc123"));              // a prefix
  EXPECT_FALSE(ConstantTimeEquals("sk-abc123sk-abc123", "sk-abc123"));  // the key repeated
  EXPECT_FALSE(ConstantTimeEquals("sk-abc1234", "sk-abc123"));
  EXPECT_FALSE(ConstantTimeEquals("", "sk-abc123"));
  EXPECT_FALSE(ConstantTimeEquals("x", ""));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  std::string with_nul("k\0y", 3);
  EXPECT_TRUE(ConstantTimeEquals(with_nul, with_nul));
  EXPECT_FALSE(ConstantTimeEquals(std::string("k\0z", 3), with_nul));
  // Every single-bit flip anywhere is caught.
  const std::string key = "0123456789abcdef";
  for (size_t i = 0; i < key.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string guess = key;
      guess[i] = static_cast<char>(guess[i] ^ (1 << bit));
      EXPECT_FALSE(ConstantTimeEquals(guess, key)) << i << " " << bit;
    }
  }
}

TEST(AuthTest, BearerMatchesNeedsTheSchemeAndTheKey) {
  EXPECT_TRUE(BearerMatches("Bearer sk-1", "sk-1"));
  EXPECT_FALSE(BearerMatches("Bearer sk-2", "sk-1"));
  EXPECT_FALSE(BearerMatches("Basic sk-1", "sk-1"));
  EXPECT_FALSE(BearerMatches("sk-1", "sk-1"));
  EXPECT_FALSE(BearerMatches("Bearer ", "sk-1"));
  EXPECT_FALSE(BearerMatches("", "sk-1"));
}

}  // namespace
}  // namespace pd::server
