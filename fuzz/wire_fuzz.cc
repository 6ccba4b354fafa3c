// Fuzzes the messenger's frame decoder (messenger/wire.h DecodeFrame).
//
// Input: one mode byte, then frame bytes.
//   mode bit 0: the cluster secret is kSecret (set) or empty (clear).
//   mode bit 1: sealed (set): the harness writes the body length and the current wire version
//               into the header (the first kFrameHeaderBytes; shorter input is zero-padded) and
//               appends a valid MAC, so the fuzzed body always reaches the body decoder. Raw
//               (clear): the bytes go to DecodeFrame as received, MAC included, exercising the
//               header, length and MAC checks.
// Whatever DecodeFrame accepts must survive a round trip: EncodeFrame of the decoded frame is
// accepted again and re-encodes to the same bytes.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"
#include "messenger/wire.h"

namespace {

using pd::messenger::DecodeFrame;
using pd::messenger::EncodeFrame;
using pd::messenger::HmacSha256;

constexpr uint8_t kModeSecret = 1;
constexpr uint8_t kModeSealed = 2;
const char* const kSecret = "fuzz-cluster-secret";

void PutLe(uint64_t value, size_t num_bytes, uint8_t* out) {
  for (size_t i = 0; i < num_bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

// Header (with body_len and version fixed up) + body + a valid MAC under `secret`.
std::vector<uint8_t> Seal(const uint8_t* data, size_t size, const std::string& secret) {
  constexpr size_t kHeader = pd::messenger::kFrameHeaderBytes;
  std::vector<uint8_t> frame(data, data + size);
  if (frame.size() < kHeader) frame.resize(kHeader, 0);
  PutLe(pd::messenger::kWireVersion, 2, frame.data() + 4);  // magic u32 | version u16 | ...
  PutLe(frame.size() - kHeader, 4, frame.data() + pd::messenger::kBodyLenOffset);
  const auto mac = HmacSha256(secret, frame.data(), frame.size());
  frame.insert(frame.end(), mac.begin(), mac.end());
  return frame;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string secret = (mode & kModeSecret) ? kSecret : "";
  std::vector<uint8_t> frame = (mode & kModeSealed) ? Seal(data + 1, size - 1, secret)
                                                    : std::vector<uint8_t>(data + 1, data + size);
  auto decoded = DecodeFrame(frame.data(), frame.size(), secret);
  if (!decoded.ok()) {
    PD_CHECK(!decoded.status().message().empty()) << "a refused frame's error names no problem";
    return 0;
  }
  const std::vector<uint8_t> encoded = EncodeFrame(*decoded, secret);
  auto again = DecodeFrame(encoded.data(), encoded.size(), secret);
  PD_CHECK(again.ok()) << "re-encoded frame refused: " << again.status().ToString();
  PD_CHECK(again->sender_seq == decoded->sender_seq);
  PD_CHECK(again->sender_session == decoded->sender_session);
  PD_CHECK(again->recipient_session == decoded->recipient_session);
  PD_CHECK(again->message.index() == decoded->message.index());
  PD_CHECK(EncodeFrame(*again, secret) == encoded) << "encoding is not stable";
  return 0;
}
