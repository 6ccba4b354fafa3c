// An incremental HTTP/1.1 response reader for the router's upstream connections: bytes in as they
// arrive (any split), out come the status, the headers and the body. A chunked body comes out one
// whole chunk at a time (the decode instance writes one SSE event per chunk, so the router relays
// whole events and can end a stream cleanly between two of them); a Content-Length body comes
// out whole; a body delimited by the connection's close comes out as it arrives and ends at
// FinishAtEof().
//
// Thread safety: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pd::server {

class HttpResponseParser {
 public:
  // Consumes `data`; whole body pieces are appended to *pieces. An error (malformed response or
  // a head over 64 KiB) is final.
  Status Feed(std::string_view data, std::vector<std::string>* pieces);
  // The peer closed the connection: ends a close-delimited body (its bytes into *pieces). False
  // when the response was cut short.
  bool FinishAtEof(std::vector<std::string>* pieces);

  bool head_done() const { return state_ != State::kHead; }
  bool done() const { return state_ == State::kDone; }
  int status() const { return status_; }
  bool chunked() const { return chunked_; }
  // The connection can carry another request after this response.
  bool keep_alive() const { return keep_alive_; }
  // A header's value (names compare case-insensitively); "" when absent.
  std::string Header(std::string_view name) const;

 private:
  enum class State {
    kHead,
    kChunkSize,
    kChunkData,
    kChunkEnd,
    kTrailer,
    kLength,
    kUntilEof,
    kDone
  };
  Status ParseHead(std::string_view head);
  Status Step(std::vector<std::string>* pieces, bool* progressed);

  State state_ = State::kHead;
  std::string buf_;  // bytes not consumed yet
  int status_ = 0;
  bool chunked_ = false;
  bool keep_alive_ = true;
  uint64_t remaining_ = 0;  // of the current chunk or of a Content-Length body
  std::string piece_;       // the body piece being assembled
  std::vector<std::pair<std::string, std::string>> headers_;
};

}  // namespace pd::server
