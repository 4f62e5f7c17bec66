// server::ParseHttpRequests: the HTTP port's framing over a byte buffer (the server's own parser
// settings and refusals), including the same bytes arriving in two reads.
#include "server/http_parse.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace modserve::server {
namespace {

HttpParseLimits Small() {
  HttpParseLimits limits;
  limits.max_body_bytes = 16;
  limits.max_header_bytes = 128;
  return limits;
}

TEST(HttpParseTest, PipelinedRequestsStopAfterOneThatCloses) {
  const std::string in =
      "GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
      "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
      "2\r\nhi\r\n1\r\n!\r\n0\r\n\r\n"
      "GET /never HTTP/1.1\r\n\r\n";
  for (size_t split = 0; split <= in.size(); ++split) {
    SCOPED_TRACE(split);
    const HttpParseResult r = ParseHttpRequests(in, Small(), split);
    ASSERT_EQ(r.requests.size(), 3u);
    EXPECT_EQ(r.requests[0].method, "GET");
    EXPECT_EQ(r.requests[0].path, "/v1/models");
    EXPECT_EQ(r.requests[0].query, "x=1");
    EXPECT_EQ(r.requests[0].Header("host"), "a");
    EXPECT_EQ(r.requests[1].body, "abc");
    EXPECT_EQ(r.requests[2].body, "hi!");
    EXPECT_FALSE(r.requests[2].keep_alive);
    EXPECT_EQ(r.ignored_bytes, std::string("GET /never HTTP/1.1\r\n\r\n").size());
    EXPECT_FALSE(r.refusal.has_value());
    EXPECT_FALSE(r.incomplete);
  }
}

TEST(HttpParseTest, OversizedBodiesAre413ByLengthAndByChunks) {
  HttpParseResult r =
      ParseHttpRequests("POST / HTTP/1.1\r\nContent-Length: 17\r\n\r\n", Small());
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->status, 413);
  EXPECT_EQ(r.refusal->message, "request body of 17 bytes exceeds --http_max_body_bytes=16");
  r = ParseHttpRequests(
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n9\r\n123456789\r\n",
      Small());
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->status, 413);
  EXPECT_EQ(r.refusal->message, "request body exceeds --http_max_body_bytes=16");
}

TEST(HttpParseTest, HugeHeadersAre431AndMalformedFramingIs400) {
  HttpParseResult r = ParseHttpRequests(
      "GET / HTTP/1.1\r\nX-Pad: " + std::string(200, 'a') + "\r\n\r\n", Small());
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->status, 431);
  // Beast holds the request line and the fields to the limit each; together they must be too.
  r = ParseHttpRequests("GET /" + std::string(90, 'p') + " HTTP/1.1\r\nX-Pad: " +
                            std::string(90, 'a') + "\r\n\r\n",
                        Small());
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->status, 431);
  EXPECT_EQ(r.refusal->message, "request headers exceed 128 bytes");
  for (const char* bad : {"G(T / HTTP/1.1\r\n\r\n", "POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",
                          "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
                          "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}) {
    SCOPED_TRACE(bad);
    r = ParseHttpRequests(bad, Small());
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->status, 400);
    EXPECT_EQ(r.refusal->message.rfind("malformed HTTP request: ", 0), 0u) << r.refusal->message;
  }
}

// A header over the limit is 431 whatever it declares and wherever the reads cut it. Beast holds
// the request line and the fields to the limit each, and checks a declared length against the
// body limit when the header ends; left to itself it answered 413 to the bytes in one read, and
// 431 when a read ended inside the request line (it then also holds the whole header to the
// limit).
TEST(HttpParseTest, AHeaderOverTheLimitIs431WhateverItDeclaresAndWhereverItIsCut) {
  const std::string in = "POST /v1/" + std::string(26, 'c') +
                         " HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + std::string(90, 'x');
  auto refused_at_every_split = [&](int32_t header_limit, int status, const std::string& message) {
    HttpParseLimits limits;
    limits.max_body_bytes = 1;
    limits.max_header_bytes = header_limit;
    for (size_t split = 0; split <= in.size(); ++split) {
      SCOPED_TRACE(split);
      const HttpParseResult r = ParseHttpRequests(in, limits, split);
      ASSERT_TRUE(r.refusal.has_value());
      EXPECT_EQ(r.refusal->status, status);
      EXPECT_EQ(r.refusal->message, message);
    }
  };
  refused_at_every_split(64, 431, "request headers exceed 64 bytes");
  // Within the header limit, the declared length is what is refused, before any of the body.
  refused_at_every_split(128, 413, "request body of 1000 bytes exceeds --http_max_body_bytes=1");
}

// A Content-Length list or repeat is one length only when its values are the same digits: "01"
// and "1" are the same number, but a reader that takes the first text or rejects leading zeros
// would count another body.
TEST(HttpParseTest, ContentLengthRepeatsMustBeTheSameDigits) {
  for (const char* same : {"Content-Length: 1, 1\r\n", "Content-Length: 1\r\nContent-Length: 1\r\n",
                           "Content-Length: 01\r\n"}) {
    SCOPED_TRACE(same);
    const HttpParseResult r =
        ParseHttpRequests(absl::StrCat("POST / HTTP/1.1\r\n", same, "\r\nP"), Small());
    ASSERT_EQ(r.requests.size(), 1u);
    EXPECT_EQ(r.requests[0].body, "P");
    EXPECT_FALSE(r.refusal.has_value());
  }
  for (const char* differ :
       {"Content-Length: 01,1\r\n", "Content-Length: 1\r\nContent-Length: 01\r\n",
        "Content-Length: 1, 1,01\r\n"}) {
    SCOPED_TRACE(differ);
    const std::string in = absl::StrCat("POST / HTTP/1.1\r\n", differ, "\r\nP");
    for (size_t split = 0; split <= in.size(); ++split) {
      const HttpParseResult r = ParseHttpRequests(in, Small(), split);
      EXPECT_TRUE(r.requests.empty());
      ASSERT_TRUE(r.refusal.has_value());
      EXPECT_EQ(r.refusal->status, 400);
      EXPECT_EQ(r.refusal->message, "malformed HTTP request: Content-Length values that differ");
    }
  }
}

// A chunk-size line whose extension is a quoted string running past the line's CRLF: Beast
// takes the chunk's size off the body limit, then finds it needs more bytes for the extension,
// and when more arrive takes the size off again. A read boundary past that CRLF then turned a
// 12-byte chunk under the 16-byte limit into 413. Wherever the bytes are cut, the result must be
// the one a single read gives: 400 when the quote closes after the CRLF, waiting when it never
// does; and the sizes of chunks that are accepted still count once each toward the limit.
TEST(HttpParseTest, AChunkExtensionPastItsLineEndsTheSameWhereverItIsCut) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string closes_late = head + "C;e=\"ab\r\ncd\"\r\n0123456789ab\r\n0\r\n\r\n";
  const std::string never_closes = head + "C;e=\"ab\r\ncdefghijklmnopqrstuvwxyz";
  for (size_t split = 0; split <= closes_late.size(); ++split) {
    SCOPED_TRACE(split);
    const HttpParseResult r = ParseHttpRequests(closes_late, Small(), split);
    EXPECT_TRUE(r.requests.empty());
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->status, 400) << r.refusal->message;
  }
  for (size_t split = 0; split <= never_closes.size(); ++split) {
    SCOPED_TRACE(split);
    const HttpParseResult r = ParseHttpRequests(never_closes, Small(), split);
    EXPECT_TRUE(r.requests.empty());
    EXPECT_TRUE(r.incomplete);
    EXPECT_FALSE(r.refusal.has_value()) << r.refusal->status << " " << r.refusal->message;
  }
  // Chunks of 9 and 7 bytes fill the 16-byte limit exactly; one more byte is 413, at any cut.
  const std::string fills = head + "9;a=1\r\n123456789\r\n7;b=\"x\"\r\n1234567\r\n0\r\n\r\n";
  const std::string over = head + "9;a=1\r\n123456789\r\n8;b=\"x\"\r\n12345678\r\n0\r\n\r\n";
  for (size_t split = 0; split <= over.size(); ++split) {
    SCOPED_TRACE(split);
    const HttpParseResult ok = ParseHttpRequests(fills, Small(), split);
    ASSERT_EQ(ok.requests.size(), 1u);
    EXPECT_EQ(ok.requests[0].body, "1234567891234567");
    const HttpParseResult r = ParseHttpRequests(over, Small(), split);
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->status, 413);
    EXPECT_EQ(r.refusal->message, "request body exceeds --http_max_body_bytes=16");
  }
}

TEST(HttpParseTest, ARequestCutShortIsIncomplete) {
  const HttpParseResult r =
      ParseHttpRequests("GET /a HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
                        Small(), 10);
  EXPECT_EQ(r.requests.size(), 1u);
  EXPECT_TRUE(r.incomplete);
  EXPECT_FALSE(r.refusal.has_value());
}

TEST(HttpParseTest, TheErrorBodyIsOpenAisErrorObjectWithControlsEscaped) {
  EXPECT_EQ(HttpErrorBody("a \"b\"\n"),
            "{\"error\":{\"message\":\"a \\\"b\\\"\\u000a\",\"type\":\"invalid_request_error\","
            "\"param\":null,\"code\":null}}");
}

}  // namespace
}  // namespace modserve::server
