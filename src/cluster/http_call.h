// A small blocking HTTP/1.1 client for etcd's JSON gateway: one POST per fresh connection
// ("Connection: close"), or a POST whose answer streams (a watch), read piece by piece. Answers are
// read with server::HttpResponseParser. Every step has a deadline.
//
// Thread safety: HttpPost from any thread. An HttpStream has one reader; Cancel may be called
// from any thread while it reads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/http_response_parser.h"

namespace pd::cluster {

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// "host:port" ("[v6]:port" too). InvalidArgument naming what is wrong.
Result<HostPort> ParseHostPort(const std::string& text);

struct HttpReply {
  int status = 0;
  std::string body;
};

// POSTs `body` (application/json) to http://ep/path and reads the whole answer, all within
// timeout_ms. Unavailable when the server cannot be reached or the answer is cut short,
// DeadlineExceeded past the deadline.
Result<HttpReply> HttpPost(const HostPort& ep, const std::string& path, const std::string& body,
                           int timeout_ms);

// A POST whose answer comes as a stream of chunks.
class HttpStream {
 public:
  // Connects, sends the request and waits for the answer's head (all within timeout_ms); a
  // status other than 200 is an error carrying the body's start.
  static Result<std::unique_ptr<HttpStream>> Open(const HostPort& ep, const std::string& path,
                                                  const std::string& body, int timeout_ms);
  ~HttpStream();
  HttpStream(const HttpStream&) = delete;
  HttpStream& operator=(const HttpStream&) = delete;

  // Waits up to timeout_ms for more of the body and appends what came (whole chunks) to
  // *pieces: OK (perhaps with nothing), Unavailable when the stream ended or broke, Cancelled
  // after Cancel.
  Status Read(int timeout_ms, std::vector<std::string>* pieces);
  // Makes a Read in progress (and every later one) return Cancelled at once.
  void Cancel();

 private:
  explicit HttpStream(int fd) : fd_(fd) {}
  const int fd_;
  std::atomic<bool> cancelled_{false};
  server::HttpResponseParser parser_;  // the reader's
  std::vector<std::string> early_;     // pieces that came with the head, for the first Read
};

}  // namespace pd::cluster
