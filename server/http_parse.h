// How the HTTP port reads requests off the wire: the Beast parser configuration (header and body
// limits), the refusals a malformed or oversized request gets (400 / 413 / 431, with the error
// body the server sends), and the conversion of a parsed message into an HttpRequest. The server
// drives these on its sockets; ParseHttpRequests drives them over a byte buffer, the way the
// server's reads would see those bytes, so the framing can be tested and fuzzed without sockets.
// Beast itself stays out of this header (server/http_parse_beast.h has the parser-level parts).
#ifndef MODSERVE_SERVER_HTTP_PARSE_H_
#define MODSERVE_SERVER_HTTP_PARSE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace modserve::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without the query
  std::string query;   // after '?', or empty
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // False when the request asked for the connection to close (Connection: close, or HTTP/1.0
  // without keep-alive): the server answers it and closes, reading nothing after it.
  bool keep_alive = true;

  // The first header of that name (case-insensitive), or empty.
  absl::string_view Header(absl::string_view name) const;
  // Every value of that header, in order.
  std::vector<absl::string_view> Headers(absl::string_view name) const;
};

// The limits the parser enforces (HttpServerOptions carries them as flags).
struct HttpParseLimits {
  // A larger body, by Content-Length or as a chunked body arrives: 413.
  int64_t max_body_bytes = int64_t{4} << 20;
  // The request line and headers together; larger: 431.
  int32_t max_header_bytes = 16 << 10;
};

// The most bytes a connection holds before the parser has taken them: the header limit, plus one
// read (64 KiB) past the header's end. Beast takes a body's bytes as they come, but holds a
// chunk-size line (with its extensions) or a trailer section whole until its end arrives, and
// sets no bound of its own on either; past this one the request is refused (400), where it was
// buffered until the body timeout. ParseHttpRequests does not apply it: its inputs are whole.
int64_t HttpInputBufferBytes(const HttpParseLimits& limits);

// A request the HTTP layer refuses itself: the status, the message of its error body, and then
// the connection closes.
struct HttpRefusal {
  int status = 400;
  std::string message;

  bool operator==(const HttpRefusal& o) const {
    return status == o.status && message == o.message;
  }
};

// The JSON error body of a refusal (OpenAI's error object shape, type invalid_request_error
// unless given).
std::string HttpErrorBody(absl::string_view message,
                          absl::string_view type = "invalid_request_error");

struct HttpParseResult {
  // The complete requests, in order, that the server would hand to its handler.
  std::vector<HttpRequest> requests;
  // Set when the bytes after those requests are refused (the connection then closes).
  std::optional<HttpRefusal> refusal;
  // No refusal, and the bytes end inside a request (the server would wait for the rest, up to
  // its header / body timeouts).
  bool incomplete = false;
  // The input bytes the complete requests took.
  size_t consumed_bytes = 0;
  // The bytes after the last request when that request closes the connection (not keep-alive):
  // the server never reads them.
  size_t ignored_bytes = 0;
};

// Parses `bytes` as one connection's input with the server's parser settings, as if they had
// arrived in two reads split at `split` (clamped to the input). Pipelined requests are read one
// after another, as the server reads them.
//
// Beast's parser, once a read ended inside a request's headers, looks for their CRLF CRLF only
// after the point where it stopped, and parses them only once it has found one; and it holds
// the request line and the fields to the header limit separately, except while it waits for
// that CRLF CRLF (the total then). A malformed or oversized header can therefore be refused
// (400, 431) when it comes in one read but wait for more (then 431, or the header timeout's
// 408) when a read boundary falls inside it, or the other way round. Which requests are
// accepted, and what they hold, never depends on how the bytes are split.
HttpParseResult ParseHttpRequests(absl::string_view bytes, const HttpParseLimits& limits,
                                  size_t split = 0);

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_HTTP_PARSE_H_
