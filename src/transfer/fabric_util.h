// Small libfabric helpers shared by the transfer engine: RAII owners for fids and fi_info, and
// Status values that name the libfabric call that failed with its error text.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pd::transfer {

// Closes any libfabric object (fabric, domain, av, cq, ep, mr) exactly once.
struct FidCloser {
  void operator()(fid_fabric* f) const { Close(&f->fid); }
  void operator()(fid_domain* f) const { Close(&f->fid); }
  void operator()(fid_av* f) const { Close(&f->fid); }
  void operator()(fid_cq* f) const { Close(&f->fid); }
  void operator()(fid_ep* f) const { Close(&f->fid); }
  void operator()(fid_mr* f) const { Close(&f->fid); }
  static void Close(fid* f);
};

template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser>;

struct FiInfoDeleter {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};
using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;

// "fi_mr_reg: -12 Cannot allocate memory", with a code that fits the error: a peer gone or
// unreachable is Unavailable, a key or length the peer rejected is InvalidArgument, a full queue is
// ResourceExhausted, a cancelled operation Cancelled, anything else Internal.
Status FabricError(std::string_view call, int64_t rc);

// Maps a positive libfabric errno (from fi_cq_err_entry::err) to a StatusCode.
StatusCode FabricErrorCode(int err);

// Human readable names of mr_mode and mode bits, for logs and `fi_info`-like output.
std::string MrModeToString(uint64_t mr_mode);
std::string ModeToString(uint64_t mode);

// Hex dump of address bytes, e.g. "0200a3f47f000001...".
std::string HexBytes(std::string_view bytes);

}  // namespace pd::transfer
