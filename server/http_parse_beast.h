// The Beast-level half of server/http_parse.h, for the server's connections and the byte-buffer
// parser: one parser configuration and one mapping from parse errors to refusals.
#ifndef MODSERVE_SERVER_HTTP_PARSE_BEAST_H_
#define MODSERVE_SERVER_HTTP_PARSE_BEAST_H_

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstdint>
#include <optional>

#include "server/http_parse.h"

namespace modserve::server {

using HttpRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// A fresh parser for the next request, with the header limit set and no body limit yet.
void ConfigureHttpParser(HttpRequestParser& parser, const HttpParseLimits& limits);

// Once the headers are in (`header_bytes`: what the parser took for the request line and
// headers): 431 when they exceed the header limit, 413 when a declared Content-Length exceeds
// the body limit (refused before any of the body is read), or nothing. Beast applies its
// header_limit to the request line and to the header fields separately, so together they can
// reach twice the limit; the first check holds the total to it. Beast holds the whole header to
// the limit only when a read ended inside it, and it checks a declared length against its body
// limit as the header ends: with that limit set during the header, a header over the limit
// declaring too long a body was 413 in one read and 431 in two. So the header is read with no
// body limit, and 431 comes first here whatever the reads' boundaries.
std::optional<HttpRefusal> CheckHttpHeader(const HttpRequestParser& parser, size_t header_bytes,
                                           const HttpParseLimits& limits);

// A chunked body's sizes against the body limit, counted as the parser accepts each chunk's
// line. Beast's own count (its body limit) takes a chunk's size off before it has parsed the
// line's extensions; when they need more bytes (a quoted string running past the line's end), it
// takes the size off again once they arrive, so a body under the limit could be refused (413) or
// not depending on where a read ended. This count sees each accepted line once.
struct HttpChunkBudget {
  uint64_t limit = 0;
  uint64_t accepted = 0;
  void operator()(std::uint64_t size, boost::beast::string_view extensions,
                  boost::beast::error_code& ec);
};

// After CheckHttpHeader has passed, before any of the body is read: a chunked body is held to the
// body limit by `budget` (a Content-Length one was checked by CheckHttpHeader), which the parser
// calls by reference, so it must outlive the parser's reads.
void ArmHttpBodyLimit(HttpRequestParser& parser, const HttpParseLimits& limits,
                      HttpChunkBudget& budget);

// The refusal for a parse error: 413 (body limit), 431 (header limit), 400 (any other HTTP
// error). Nothing for errors that are not about the request (end of stream, socket errors):
// the connection just closes.
std::optional<HttpRefusal> RefusalForParseError(boost::beast::error_code ec,
                                                const HttpParseLimits& limits);

// The finished message as the handler sees it.
HttpRequest ToHttpRequest(boost::beast::http::request<boost::beast::http::string_body>&& msg);

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_HTTP_PARSE_BEAST_H_
