#include "common/status.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace pd {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kUnimplemented:
      return "Unimplemented";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kIoError:
      return "IoError";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

#define PD_DEFINE_STATUS_FACTORY(Name) \
  Status Name(std::string message) { return Status(StatusCode::k##Name, std::move(message)); }
PD_DEFINE_STATUS_FACTORY(InvalidArgument)
PD_DEFINE_STATUS_FACTORY(NotFound)
PD_DEFINE_STATUS_FACTORY(AlreadyExists)
PD_DEFINE_STATUS_FACTORY(OutOfRange)
PD_DEFINE_STATUS_FACTORY(ResourceExhausted)
PD_DEFINE_STATUS_FACTORY(FailedPrecondition)
PD_DEFINE_STATUS_FACTORY(Unavailable)
PD_DEFINE_STATUS_FACTORY(DeadlineExceeded)
PD_DEFINE_STATUS_FACTORY(Cancelled)
PD_DEFINE_STATUS_FACTORY(DataLoss)
PD_DEFINE_STATUS_FACTORY(Unimplemented)
PD_DEFINE_STATUS_FACTORY(Internal)
PD_DEFINE_STATUS_FACTORY(IoError)
#undef PD_DEFINE_STATUS_FACTORY

namespace internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << file << ":" << line << ": check failed: " << condition << " ";
}

CheckFailure::~CheckFailure() {
  std::cerr << stream_.str() << std::endl;
  std::abort();
}

}  // namespace internal
}  // namespace pd
