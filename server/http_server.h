// An HTTP/1.1 server on Boost.Beast (Beast parses; nothing here parses HTTP by hand): plaintext
// or TLS, keep-alive, bounded request headers and bodies, deadlines for the request's arrival
// (slow clients get 408 and are closed) and for each write (a client that stops reading is
// closed), unary and chunked (server-sent events) responses, and disconnect detection while a
// request is being handled, so the handler can cancel its work when the client goes away. It
// knows nothing of OpenAI, the engine or JSON: a handler does the rest.
//
// Threads: a few I/O threads run every connection; each connection's work runs in order on its
// own strand, and a handler's long work happens elsewhere (it posts its results back), so no
// connection can stall another.
#ifndef MODSERVE_SERVER_HTTP_SERVER_H_
#define MODSERVE_SERVER_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/http_parse.h"
#include "server/security.h"

namespace modserve::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 picks a free port
  int num_threads = 2;
  // A larger body (by Content-Length, or as a chunked body arrives) gets 413 naming
  // --http_max_body_bytes, and the connection is closed (server/http_parse.h has the framing).
  int64_t max_body_bytes = int64_t{4} << 20;
  int32_t max_header_bytes = 16 << 10;  // request line + headers; larger: 431
  // The request line and headers must arrive within header_timeout of the connection being
  // accepted (or of the first byte of a later request), the body within body_timeout after the
  // headers; otherwise 408 (when part of a request came) and close.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  // A keep-alive connection may idle this long between requests (then header_timeout runs
  // from the next request's first byte). Longer than clients' own pool expiry (httpx: 5 s), so
  // a client never sends on a connection the server is closing.
  absl::Duration idle_timeout = absl::Seconds(30);
  // One write of the response may take this long; a client that stops reading is closed (and
  // its request cancelled through OnClose).
  absl::Duration write_timeout = absl::Seconds(30);
  int32_t max_connections = 1024;  // accepted past this: closed at once
  TlsOptions tls;                  // cert_file empty = plaintext
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The response side of one request. Every method but Post must run on the connection's strand:
// in the handler, or in a task given to Post. Exactly one of Reply, or StartStream then any
// Writes then End; calls after the response is complete, or after the connection closed, are
// ignored.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  virtual void Reply(int status, absl::string_view content_type, std::string body,
                     const HttpHeaders& headers = {}) = 0;
  // Chunked transfer: the status and headers go out now, each Write as it comes (writes that
  // queue behind a slow client merge into one), End sends the last chunk.
  virtual void StartStream(int status, absl::string_view content_type,
                           const HttpHeaders& headers = {}) = 0;
  virtual void Write(absl::string_view data) = 0;
  virtual void End() = 0;

  // Runs `task` later on the connection's strand, never inline; safe from any thread (this is
  // how the engine's sinks hand tokens over). Tasks posted after the server stopped are
  // dropped.
  virtual void Post(std::function<void()> task) = 0;
  // `on_close` runs once, on the strand, when the connection ends before this exchange's
  // response is complete: the client disconnected, a write timed out, or the server stopped.
  virtual void OnClose(std::function<void()> on_close) = 0;
  virtual bool closed() const = 0;
};

// Called on the connection's strand for each complete request; must not block.
using HttpHandler = std::function<void(HttpRequest& request, std::shared_ptr<HttpExchange>)>;

class HttpServer {
 public:
  // InvalidArgument for bad TLS files (naming the flag); Unavailable when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();  // Stop()

  int port() const;
  int32_t num_connections() const;
  // Stops accepting, closes every connection (their exchanges' OnClose run) and joins the I/O
  // threads. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_HTTP_SERVER_H_
