#include "common/status.h"

#include <gtest/gtest.h>

namespace pd {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckPositive(int x) {
  if (x <= 0) return OutOfRange("not positive");
  return OkStatus();
}

Status Both(int a, int b) {
  RETURN_IF_ERROR(CheckPositive(a));
  RETURN_IF_ERROR(Half(b));
  return OkStatus();
}

TEST(StatusTest, PropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().ToString(), "InvalidArgument: odd: 3");
  EXPECT_TRUE(Both(1, 2).ok());
  EXPECT_EQ(Both(0, 2).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(Both(1, 3).code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, WithContextPrefixes) {
  Status s = NotFound("tensor x").WithContext("model.safetensors");
  EXPECT_EQ(s.message(), "model.safetensors: tensor x");
  EXPECT_TRUE(OkStatus().WithContext("a").ok());
}

TEST(StatusDeathTest, ValueOnErrorAborts) {
  Result<int> r = InvalidArgument("bad");
  EXPECT_DEATH((void)r.value(), "bad");
}

}  // namespace
}  // namespace pd
