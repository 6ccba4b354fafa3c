#include "server/http_response_parser.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace pd::server {

namespace {

constexpr size_t kMaxHeadBytes = 64u << 10;
constexpr size_t kMaxLineBytes = 4096;  // a chunk-size or trailer line

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

std::string HttpResponseParser::Header(std::string_view name) const {
  for (const auto& [k, v] : headers_) {
    if (EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

Status HttpResponseParser::ParseHead(std::string_view head) {
  // "HTTP/1.1 200 OK"
  const size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  if (line.size() < 12 || line.substr(0, 5) != "HTTP/" || line[8] != ' ')
    return DataLoss("malformed status line: " + std::string(line.substr(0, 80)));
  status_ = std::atoi(std::string(line.substr(9, 3)).c_str());
  if (status_ < 100 || status_ > 999) return DataLoss("malformed status: " + std::string(line));
  keep_alive_ = line.substr(5, 3) == "1.1";
  std::string_view rest = eol == std::string_view::npos ? "" : head.substr(eol + 2);
  while (!rest.empty()) {
    const size_t end = rest.find("\r\n");
    std::string_view h = rest.substr(0, end);
    rest = end == std::string_view::npos ? "" : rest.substr(end + 2);
    const size_t colon = h.find(':');
    if (colon == std::string_view::npos) return DataLoss("malformed header: " + std::string(h));
    headers_.emplace_back(std::string(Trim(h.substr(0, colon))),
                          std::string(Trim(h.substr(colon + 1))));
  }
  const std::string connection = Header("Connection");
  if (EqualsIgnoreCase(connection, "close")) keep_alive_ = false;
  if (EqualsIgnoreCase(connection, "keep-alive")) keep_alive_ = true;
  const std::string length = Header("Content-Length");
  if (EqualsIgnoreCase(Header("Transfer-Encoding"), "chunked")) {
    chunked_ = true;
    state_ = State::kChunkSize;
  } else if (!length.empty()) {
    char* end = nullptr;
    remaining_ = std::strtoull(length.c_str(), &end, 10);
    if (*end != '\0') return DataLoss("malformed Content-Length: " + length);
    state_ = remaining_ == 0 ? State::kDone : State::kLength;
  } else if (status_ == 204 || status_ == 304 || status_ < 200) {
    state_ = State::kDone;
  } else {
    keep_alive_ = false;
    state_ = State::kUntilEof;
  }
  return OkStatus();
}

// One step of the body's state machine over buf_; *progressed false when it needs more bytes.
Status HttpResponseParser::Step(std::vector<std::string>* pieces, bool* progressed) {
  *progressed = false;
  auto take_line = [&](std::string* line) {
    const size_t eol = buf_.find("\r\n");
    if (eol == std::string::npos) return false;
    *line = buf_.substr(0, eol);
    buf_.erase(0, eol + 2);
    return true;
  };
  std::string line;
  switch (state_) {
    case State::kChunkSize: {
      if (!take_line(&line)) {
        if (buf_.size() > kMaxLineBytes) return DataLoss("chunk-size line too long");
        return OkStatus();
      }
      char* end = nullptr;
      remaining_ = std::strtoull(line.c_str(), &end, 16);
      if (end == line.c_str() || (*end != '\0' && *end != ';' && *end != ' '))
        return DataLoss("malformed chunk size: " + line.substr(0, 80));
      state_ = remaining_ == 0 ? State::kTrailer : State::kChunkData;
      break;
    }
    case State::kChunkData:
    case State::kLength: {
      if (buf_.empty()) return OkStatus();
      const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, buf_.size()));
      piece_.append(buf_, 0, n);
      buf_.erase(0, n);
      remaining_ -= n;
      if (remaining_ > 0) return OkStatus();
      pieces->push_back(std::move(piece_));
      piece_.clear();
      state_ = state_ == State::kLength ? State::kDone : State::kChunkEnd;
      break;
    }
    case State::kChunkEnd:
      if (buf_.size() < 2) return OkStatus();
      if (buf_.compare(0, 2, "\r\n") != 0) return DataLoss("chunk not followed by CRLF");
      buf_.erase(0, 2);
      state_ = State::kChunkSize;
      break;
    case State::kTrailer:
      if (!take_line(&line)) {
        if (buf_.size() > kMaxLineBytes) return DataLoss("trailer line too long");
        return OkStatus();
      }
      if (line.empty()) state_ = State::kDone;
      break;
    case State::kUntilEof:
      if (buf_.empty()) return OkStatus();
      pieces->push_back(std::move(buf_));
      buf_.clear();
      break;
    case State::kHead:
    case State::kDone:
      return OkStatus();
  }
  *progressed = true;
  return OkStatus();
}

Status HttpResponseParser::Feed(std::string_view data, std::vector<std::string>* pieces) {
  if (state_ == State::kDone) return OkStatus();  // bytes after the response: not ours
  buf_.append(data);
  if (state_ == State::kHead) {
    const size_t end = buf_.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (buf_.size() > kMaxHeadBytes) return DataLoss("response head over 64 KiB");
      return OkStatus();
    }
    RETURN_IF_ERROR(ParseHead(std::string_view(buf_).substr(0, end)));
    buf_.erase(0, end + 4);
    if (status_ < 200 && status_ != 101) {  // 100 Continue: the real response follows
      headers_.clear();
      state_ = State::kHead;
      return Feed("", pieces);
    }
  }
  for (bool progressed = true; progressed && state_ != State::kDone;) {
    RETURN_IF_ERROR(Step(pieces, &progressed));
  }
  return OkStatus();
}

bool HttpResponseParser::FinishAtEof(std::vector<std::string>* pieces) {
  if (state_ == State::kUntilEof) {
    if (!buf_.empty()) pieces->push_back(std::move(buf_));
    buf_.clear();
    state_ = State::kDone;
  }
  return state_ == State::kDone;
}

}  // namespace pd::server
