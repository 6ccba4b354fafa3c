#include "transfer/fabric_util.h"

#include <rdma/fi_errno.h>

#include "common/log.h"

namespace pd::transfer {

void FidCloser::Close(fid* f) {
  if (f == nullptr) return;
  int rc = fi_close(f);
  if (rc != 0) PD_LOG_WARN("fi_close: {} {}", rc, fi_strerror(-rc));
}

StatusCode FabricErrorCode(int err) {
  switch (err) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_EHOSTDOWN:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ESHUTDOWN:
    case FI_EADDRNOTAVAIL:
    case FI_EIO:
    case FI_ECANCELED:  // we never fi_cancel writes: the provider aborted it (connection torn down)
      return StatusCode::kUnavailable;
    case FI_EINVAL:
    case FI_EACCES:
    case FI_EKEYREJECTED:
    case FI_ENOKEY:
    case FI_EREMOTEIO:
    case FI_EMSGSIZE:
    case FI_EOVERRUN:
    case FI_ETRUNC:
    case FI_EBADFLAGS:
      return StatusCode::kInvalidArgument;
    case FI_EAGAIN:
    case FI_ENOMEM:
    case FI_ENOSPC:
      return StatusCode::kResourceExhausted;
    case FI_ETIMEDOUT:
      return StatusCode::kDeadlineExceeded;
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
      return StatusCode::kUnimplemented;
    default:
      return StatusCode::kInternal;
  }
}

Status FabricError(std::string_view call, int64_t rc) {
  int err = static_cast<int>(rc < 0 ? -rc : rc);
  std::string message(call);
  message += ": -" + std::to_string(err) + " " + fi_strerror(err);
  return Status(FabricErrorCode(err), std::move(message));
}

namespace {
template <typename Table>
std::string BitsToString(uint64_t bits, const Table& table) {
  std::string out;
  for (const auto& [bit, name] : table) {
    if ((bits & bit) == 0) continue;
    if (!out.empty()) out += '|';
    out += name;
  }
  return out.empty() ? "0" : out;
}
}  // namespace

std::string MrModeToString(uint64_t mr_mode) {
  static const std::pair<uint64_t, const char*> kTable[] = {
      {FI_MR_LOCAL, "FI_MR_LOCAL"},         {FI_MR_RAW, "FI_MR_RAW"},
      {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"}, {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"},
      {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},   {FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
      {FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"}, {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"},
      {FI_MR_HMEM, "FI_MR_HMEM"},
  };
  return BitsToString(mr_mode, kTable);
}

std::string ModeToString(uint64_t mode) {
  static const std::pair<uint64_t, const char*> kTable[] = {
      {FI_CONTEXT, "FI_CONTEXT"},
      {FI_CONTEXT2, "FI_CONTEXT2"},
      {FI_RX_CQ_DATA, "FI_RX_CQ_DATA"},
      {FI_MSG_PREFIX, "FI_MSG_PREFIX"},
      {FI_ASYNC_IOV, "FI_ASYNC_IOV"},
      {FI_LOCAL_MR, "FI_LOCAL_MR"},
      {FI_BUFFERED_RECV, "FI_BUFFERED_RECV"},
  };
  return BitsToString(mode, kTable);
}

std::string HexBytes(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

}  // namespace pd::transfer
