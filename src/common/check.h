// PD_CHECK: a broken invariant (a bug) aborts with a message. Expected failures are a Status.
#pragma once

#include <sstream>

namespace pd::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Makes `cond ? (void)0 : Voidify() & CheckFailure(...) << ...` type-check.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace pd::internal

#define PD_CHECK(cond)          \
  (cond) ? static_cast<void>(0) \
         : ::pd::internal::Voidify() & ::pd::internal::CheckFailure(__FILE__, __LINE__, #cond)

#define PD_CHECK_EQ(a, b) PD_CHECK((a) == (b))
#define PD_CHECK_LT(a, b) PD_CHECK((a) < (b))
#define PD_CHECK_LE(a, b) PD_CHECK((a) <= (b))
#define PD_CHECK_GE(a, b) PD_CHECK((a) >= (b))
