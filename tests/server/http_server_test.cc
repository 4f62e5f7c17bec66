// HttpServer against raw loopback sockets (so malformed, slow and vanishing clients can be
// played byte by byte): keep-alive and pipelining, the size limits (413, 431), malformed requests
// (400), slow-loris headers and bodies (408, and the server keeps serving), chunked streams,
// disconnect and write-timeout detection (OnClose), Expect: 100-continue, the connection limit,
// and Stop.
#include "server/http_server.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/raw_http_client.h"

namespace modserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::RawClient;

struct Fixture {
  std::unique_ptr<HttpServer> server;
  std::atomic<int> closes{0};
};

HttpServerOptions Options() {
  HttpServerOptions o;
  o.max_body_bytes = 1024;
  o.max_header_bytes = 2048;
  o.header_timeout = absl::Milliseconds(300);
  o.body_timeout = absl::Milliseconds(300);
  o.write_timeout = absl::Milliseconds(300);
  return o;
}

std::string Post(absl::string_view path, absl::string_view body) {
  return testing::HttpPost(path, body);
}

// Echoes "METHOD PATH BODY"; /hold never answers (counts the requests it holds in `held` and
// their OnClose in `closes`); /stream streams.
std::unique_ptr<HttpServer> EchoServer(const HttpServerOptions& options, std::atomic<int>* closes,
                                       std::string* stream_payload = nullptr,
                                       std::atomic<int>* held = nullptr) {
  auto server = HttpServer::Start(options, [closes, stream_payload, held](
                                               HttpRequest& r, std::shared_ptr<HttpExchange> x) {
    if (r.path == "/hold") {
      x->OnClose([closes] { closes->fetch_add(1); });
      if (held != nullptr) held->fetch_add(1);
      return;
    }
    if (r.path == "/stream") {
      x->OnClose([closes] { closes->fetch_add(1); });
      x->StartStream(200, "text/event-stream");
      // From another thread, through Post, as the engine's sinks do.
      std::thread([x, stream_payload] {
        for (int i = 0; i < 3; ++i) {
          x->Post([x, i] { x->Write(absl::StrCat("data: ", i, "\n\n")); });
        }
        if (stream_payload != nullptr) {
          x->Post([x, stream_payload] { x->Write(*stream_payload); });
          return;  // never ends
        }
        x->Post([x] { x->End(); });
      }).detach();
      return;
    }
    x->Reply(200, "text/plain", absl::StrCat(r.method, " ", r.path, " ", r.body));
  });
  EXPECT_TRUE(server.ok()) << server.status();
  return *std::move(server);
}

template <typename Cond>
bool Eventually(Cond cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(HttpServerTest, KeepAliveAndPipelinedRequestsAnswerInOrder) {
  std::atomic<int> closes{0};
  auto server = EchoServer(Options(), &closes);
  RawClient c(server->port());
  ASSERT_TRUE(c.connected());
  c.Send(Post("/a", "one"));
  EXPECT_THAT(c.ReadResponses(1), HasSubstr("POST /a one"));
  c.TakeReceived();
  c.Send(Post("/b", "two") + Post("/c", "three"));  // pipelined
  const std::string r = c.ReadResponses(2);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK"));
  ASSERT_NE(r.find("POST /b two"), std::string::npos);
  EXPECT_LT(r.find("POST /b two"), r.find("POST /c three"));
}

TEST(HttpServerTest, OversizedBodiesAre413AndTheServerKeepsServing) {
  std::atomic<int> closes{0};
  auto server = EchoServer(Options(), &closes);
  {
    RawClient c(server->port());
    c.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n");
    const std::string r = c.ReadResponses(1);
    EXPECT_THAT(r, StartsWith("HTTP/1.1 413"));
    EXPECT_THAT(r, HasSubstr("exceeds --http_max_body_bytes=1024"));
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    RawClient c(server->port());
    std::string chunked = "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 40; ++i) chunked += "40\r\n" + std::string(64, 'x') + "\r\n";
    c.Send(chunked + "0\r\n\r\n");
    EXPECT_THAT(c.ReadResponses(1), StartsWith("HTTP/1.1 413"));
  }
  RawClient ok(server->port());
  ok.Send(Post("/fine", "x"));
  EXPECT_THAT(ok.ReadResponses(1), HasSubstr("POST /fine x"));
}

// A chunk-size line whose extension never ends: Beast holds the line whole until its CRLF and
// bounds it by nothing, so the server used to buffer whatever came until the body timeout (1 GB
// in 8 s from one loopback client). It is refused once the connection's input bound is full.
TEST(HttpServerTest, AChunkLineThatNeverEndsIs400AtTheInputBoundNotBuffered) {
  std::atomic<int> closes{0};
  const HttpServerOptions options = Options();
  auto server = EchoServer(options, &closes);
  const int64_t bound = HttpInputBufferBytes({options.max_body_bytes, options.max_header_bytes});
  {
    RawClient c(server->port());
    // Exactly the bound after the header, so that the server has read every byte when it refuses
    // (unread bytes at close would reset the connection before the answer is read).
    const std::string line = "10;e=\"" + std::string(bound - 6, 'a');
    c.Send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + line);
    const std::string r = c.ReadResponses(1);
    EXPECT_THAT(r, StartsWith("HTTP/1.1 400"));
    EXPECT_THAT(r, HasSubstr(absl::StrCat("not ended within ", bound, " bytes")));
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    // The same for a trailer section that never ends.
    RawClient c(server->port());
    const std::string trailer = "X-T: " + std::string(bound - 8, 'b');  // after "0\r\n"
    c.Send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + trailer);
    EXPECT_THAT(c.ReadResponses(1), StartsWith("HTTP/1.1 400"));
  }
  RawClient ok(server->port());
  ok.Send(Post("/fine", "x"));
  EXPECT_THAT(ok.ReadResponses(1), HasSubstr("POST /fine x"));
}

TEST(HttpServerTest, HugeHeadersAre431AndGarbageIs400) {
  std::atomic<int> closes{0};
  auto server = EchoServer(Options(), &closes);
  {
    RawClient c(server->port());
    c.Send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n");
    EXPECT_THAT(c.ReadResponses(1), StartsWith("HTTP/1.1 431"));
  }
  {
    RawClient c(server->port());
    c.Send("THIS IS NOT HTTP\r\n\r\n");
    const std::string r = c.ReadResponses(1);
    EXPECT_THAT(r, StartsWith("HTTP/1.1 400"));
    EXPECT_THAT(r, HasSubstr("malformed HTTP request"));
    EXPECT_TRUE(c.WaitClosed());
  }
}

TEST(HttpServerTest, SlowLorisGets408AndOthersAreServedMeanwhile) {
  std::atomic<int> closes{0};
  auto server = EchoServer(Options(), &closes);
  RawClient slow_header(server->port());
  slow_header.Send("POST /a HTTP/1.1\r\nHo");  // and never the rest
  RawClient slow_body(server->port());
  slow_body.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
  RawClient fast(server->port());
  fast.Send(Post("/b", "ok"));
  EXPECT_THAT(fast.ReadResponses(1), HasSubstr("POST /b ok"));
  std::string r = slow_header.ReadResponses(1);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(r, HasSubstr("--http_header_timeout"));
  r = slow_body.ReadResponses(1);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(r, HasSubstr("--http_body_timeout"));
  EXPECT_TRUE(slow_header.WaitClosed());
  EXPECT_TRUE(slow_body.WaitClosed());
  // An idle keep-alive connection is closed without a 408.
  RawClient idle(server->port());
  EXPECT_TRUE(idle.WaitClosed());
  EXPECT_EQ(idle.ReadUntil([](const std::string&) { return true; }), "");
}

TEST(HttpServerTest, KeepAliveIdlesLongerThanTheHeaderTimeoutThenCloses) {
  std::atomic<int> closes{0};
  HttpServerOptions o = Options();
  o.idle_timeout = absl::Milliseconds(900);  // three header timeouts
  auto server = EchoServer(o, &closes);
  RawClient c(server->port());
  c.Send(Post("/a", "one"));
  EXPECT_THAT(c.ReadResponses(1), HasSubstr("POST /a one"));
  c.TakeReceived();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // past header_timeout
  c.Send(Post("/b", "two"));
  EXPECT_THAT(c.ReadResponses(1), HasSubstr("POST /b two"));
  c.TakeReceived();
  EXPECT_TRUE(c.WaitClosed());  // past idle_timeout: closed, without a 408
  EXPECT_EQ(c.ReadUntil([](const std::string&) { return true; }), "");
}

TEST(HttpServerTest, StreamsChunksWrittenFromOtherThreads) {
  std::atomic<int> closes{0};
  auto server = EchoServer(Options(), &closes);
  RawClient c(server->port());
  c.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = c.ReadResponses(1);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_THAT(r, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(r, HasSubstr("data: 0\n\n"));
  EXPECT_THAT(r, HasSubstr("data: 2\n\n"));
  EXPECT_EQ(closes.load(), 0);  // completed: nothing to cancel
  // The connection is kept for the next request.
  c.TakeReceived();
  c.Send(Post("/after", "x"));
  EXPECT_THAT(c.ReadResponses(1), HasSubstr("POST /after x"));
}

TEST(HttpServerTest, ClientDisconnectRunsOnCloseAtOnce) {
  std::atomic<int> closes{0}, held{0};
  auto server = EchoServer(Options(), &closes, nullptr, &held);
  RawClient c(server->port());
  c.Send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(Eventually([&] { return held.load() == 1; }));
  c.Close();
  EXPECT_TRUE(Eventually([&] { return closes.load() == 1; }));
  EXPECT_TRUE(Eventually([&] { return server->num_connections() == 0; }));
}

TEST(HttpServerTest, AClientThatStopsReadingIsClosedAfterTheWriteTimeout) {
  std::atomic<int> closes{0};
  std::string big(64 << 20, 'x');  // far beyond the socket buffers
  auto server = EchoServer(Options(), &closes, &big);
  RawClient c(server->port());
  c.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");  // and never read
  EXPECT_TRUE(Eventually([&] { return closes.load() == 1; }));
}

TEST(HttpServerTest, Expect100ContinueGetsTheInterimResponse) {
  std::atomic<int> closes{0};
  auto server = EchoServer(Options(), &closes);
  RawClient c(server->port());
  c.Send("POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_THAT(c.ReadUntil([](const std::string& r) { return absl::StrContains(r, "\r\n\r\n"); }),
              StartsWith("HTTP/1.1 100 Continue"));
  c.Send("body");
  EXPECT_THAT(c.ReadResponses(1), HasSubstr("POST /e body"));
}

TEST(HttpServerTest, ConnectionsPastTheLimitAreClosed) {
  std::atomic<int> closes{0};
  HttpServerOptions o = Options();
  o.max_connections = 2;
  o.header_timeout = absl::Seconds(10);
  auto server = EchoServer(o, &closes);
  RawClient a(server->port()), b(server->port());
  ASSERT_TRUE(Eventually([&] { return server->num_connections() == 2; }));
  RawClient c(server->port());
  EXPECT_TRUE(c.WaitClosed());
  a.Send(Post("/a", "still"));
  EXPECT_THAT(a.ReadResponses(1), HasSubstr("POST /a still"));
}

TEST(HttpServerTest, StopClosesEveryConnectionAndRunsOnClose) {
  std::atomic<int> closes{0}, held{0};
  auto server = EchoServer(Options(), &closes, nullptr, &held);
  RawClient c(server->port());
  c.Send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
  // The connection is counted when accepted, before its request is read: wait for the handler.
  ASSERT_TRUE(Eventually([&] { return held.load() == 1; }));
  server->Stop();
  EXPECT_EQ(closes.load(), 1);
  EXPECT_TRUE(c.WaitClosed());
  server->Stop();  // idempotent
}

}  // namespace
}  // namespace modserve::server
