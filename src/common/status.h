// Status and Result<T>: the one error system of pdserve. Library code never throws; fallible
// functions return a Status or a Result<T> by value.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/check.h"

namespace pd {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something malformed
  kNotFound,         // a file, tensor, model or request that does not exist
  kAlreadyExists,
  kOutOfRange,         // an index or length beyond its bound
  kResourceExhausted,  // a pool, a queue or memory is full
  kFailedPrecondition,
  kUnavailable,  // a peer is gone or not reachable
  kDeadlineExceeded,
  kCancelled,
  kDataLoss,  // a truncated or corrupt file
  kUnimplemented,
  kInternal,
  kIoError,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: config.json: hidden_size must be positive"
  std::string ToString() const;
  // Returns a copy whose message is "context: message".
  Status WithContext(std::string_view context) const;
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status AlreadyExists(std::string message);
Status OutOfRange(std::string message);
Status ResourceExhausted(std::string message);
Status FailedPrecondition(std::string message);
Status Unavailable(std::string message);
Status DeadlineExceeded(std::string message);
Status Cancelled(std::string message);
Status DataLoss(std::string message);
Status Unimplemented(std::string message);
Status Internal(std::string message);
Status IoError(std::string message);

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    PD_CHECK(!status_.ok()) << "Result constructed from an OK status without a value";
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & {
    PD_CHECK(ok()) << "Result::value() on error: " << status_.ToString();
    return *value_;
  }
  const T& value() const& {
    PD_CHECK(ok()) << "Result::value() on error: " << status_.ToString();
    return *value_;
  }
  T&& value() && {
    PD_CHECK(ok()) << "Result::value() on error: " << status_.ToString();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

namespace internal {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace pd

#define PD_CONCAT_INNER(a, b) a##b
#define PD_CONCAT(a, b) PD_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                                 \
  do {                                                        \
    ::pd::Status pd_status_ = ::pd::internal::AsStatus(expr); \
    if (!pd_status_.ok()) return pd_status_;                  \
  } while (0)

#define PD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  PD_ASSIGN_OR_RETURN_IMPL(PD_CONCAT(pd_result_, __LINE__), lhs, expr)
