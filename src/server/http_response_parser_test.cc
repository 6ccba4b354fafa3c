// The router's upstream response reader: chunked, Content-Length and close-delimited bodies,
// fed whole and one byte at a time, and malformed answers.
#include "server/http_response_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pd::server {
namespace {

constexpr char kChunked[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    "9\r\ndata: 0\n\n\r\n"
    "C;ext=1\r\ndata: 10\n\n\r\n\r\n"
    "0\r\nX-Trailer: 1\r\n\r\n";

struct Parsed {
  HttpResponseParser parser;
  std::vector<std::string> pieces;
  bool ok = true;
};

void FeedInSteps(Parsed& p, const std::string& data, size_t step) {
  for (size_t off = 0; off < data.size() && p.ok; off += step)
    p.ok = p.parser.Feed(std::string_view(data).substr(off, step), &p.pieces).ok();
}

TEST(HttpResponseParserTest, ChunkedBodyComesOutOneWholeChunkAtATimeHoweverItIsSplit) {
  for (size_t step : {size_t{1}, size_t{3}, size_t{7}, sizeof(kChunked)}) {
    Parsed p;
    FeedInSteps(p, kChunked, step);
    ASSERT_TRUE(p.ok) << step;
    EXPECT_TRUE(p.parser.done()) << step;
    EXPECT_EQ(p.parser.status(), 200);
    EXPECT_TRUE(p.parser.chunked());
    EXPECT_TRUE(p.parser.keep_alive());
    EXPECT_EQ(p.parser.Header("content-type"), "text/event-stream");
    EXPECT_EQ(p.pieces, (std::vector<std::string>{"data: 0\n\n", "data: 10\n\n\r\n"})) << step;
  }
}

TEST(HttpResponseParserTest, ContentLengthBodyComesOutWholeAndCloseIsHonoured) {
  const std::string r =
      "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 5\r\nRetry-After: 1\r\n"
      "Connection: close\r\n\r\nhello";
  Parsed p;
  FeedInSteps(p, r, 2);
  ASSERT_TRUE(p.ok);
  EXPECT_TRUE(p.parser.done());
  EXPECT_EQ(p.parser.status(), 429);
  EXPECT_FALSE(p.parser.keep_alive());
  EXPECT_EQ(p.parser.Header("Retry-After"), "1");
  EXPECT_EQ(p.pieces, std::vector<std::string>{"hello"});
}

TEST(HttpResponseParserTest, CloseDelimitedBodyEndsAtEofAndACutChunkedOneDoesNot) {
  Parsed p;
  FeedInSteps(p, "HTTP/1.0 200 OK\r\n\r\nabc", 4);
  ASSERT_TRUE(p.ok);
  EXPECT_FALSE(p.parser.done());
  EXPECT_TRUE(p.parser.FinishAtEof(&p.pieces));
  std::string body;
  for (const std::string& piece : p.pieces) body += piece;  // as it arrived
  EXPECT_EQ(body, "abc");

  Parsed cut;
  FeedInSteps(cut, std::string(kChunked).substr(0, 96), 5);
  ASSERT_TRUE(cut.ok);
  EXPECT_FALSE(cut.parser.FinishAtEof(&cut.pieces));
  EXPECT_EQ(cut.pieces, std::vector<std::string>{"data: 0\n\n"});
}

TEST(HttpResponseParserTest, MalformedAnswersAreErrors) {
  for (const std::string bad : {"HTTX/1.1 200 OK\r\n\r\n", "HTTP/1.1 abc OK\r\n\r\n",
                                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc\r\n",
                                "HTTP/1.1 200 OK\r\nno colon\r\n\r\n"}) {
    Parsed p;
    FeedInSteps(p, bad, bad.size());
    EXPECT_FALSE(p.ok) << bad;
  }
}

}  // namespace
}  // namespace pd::server
