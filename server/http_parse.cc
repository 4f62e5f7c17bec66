// The request framing of the HTTP port (server/http_parse.h): Beast parses, this file only
// configures it, names its refusals, and replays a byte buffer through it the way the server's
// socket reads (http::async_read_header, then http::async_read) would.
#include "server/http_parse.h"

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/http_parse_beast.h"

namespace modserve::server {

namespace beast = boost::beast;
namespace http = beast::http;

absl::string_view HttpRequest::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return {};
}

std::vector<absl::string_view> HttpRequest::Headers(absl::string_view name) const {
  std::vector<absl::string_view> out;
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) out.push_back(value);
  }
  return out;
}

std::string HttpErrorBody(absl::string_view message, absl::string_view type) {
  std::string escaped;
  for (char c : message) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      escaped.push_back('\\');
      escaped.push_back(c);
    } else if (u < 0x20) {
      absl::StrAppend(&escaped, absl::StrFormat("\\u%04x", u));
    } else {
      escaped.push_back(c);
    }
  }
  return absl::StrCat("{\"error\":{\"message\":\"", escaped, "\",\"type\":\"", type,
                      "\",\"param\":null,\"code\":null}}");
}

namespace {

std::string HeaderLimitMessage(const HttpParseLimits& limits) {
  return absl::StrCat("request headers exceed ", limits.max_header_bytes, " bytes");
}

}  // namespace

void ConfigureHttpParser(HttpRequestParser& parser, const HttpParseLimits& limits) {
  parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  // Beast's body limit stays off: CheckHttpHeader holds a declared length to the limit, and
  // ArmHttpBodyLimit's HttpChunkBudget a chunked body. boost::none would not do: this Beast
  // compares a declared length against the optional itself, and every length compares above
  // none.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
}

void HttpChunkBudget::operator()(std::uint64_t size, boost::beast::string_view /*extensions*/,
                                 boost::beast::error_code& ec) {
  if (size > limit - accepted) {
    ec = http::error::body_limit;
    return;
  }
  accepted += size;
}

void ArmHttpBodyLimit(HttpRequestParser& parser, const HttpParseLimits& limits,
                      HttpChunkBudget& budget) {
  // Beast's own limit stays off (ConfigureHttpParser): its count can take a size off twice.
  budget = HttpChunkBudget{static_cast<std::uint64_t>(limits.max_body_bytes), 0};
  parser.on_chunk_header(budget);
}

std::optional<HttpRefusal> CheckHttpHeader(const HttpRequestParser& parser, size_t header_bytes,
                                           const HttpParseLimits& limits) {
  if (header_bytes > static_cast<size_t>(limits.max_header_bytes)) {
    return HttpRefusal{431, HeaderLimitMessage(limits)};
  }
  // Content-Length repeated or given as a list: RFC 9110 section 8.6 lets a recipient take
  // identical values as one. Beast takes equal numbers ("01, 1") as one; the server takes only
  // the same digits, so that no other reader of the same bytes can count another length.
  std::optional<absl::string_view> first_length;
  for (const auto& field : parser.get()) {
    if (field.name() != http::field::content_length) continue;
    for (absl::string_view v :
         absl::StrSplit(absl::string_view(field.value().data(), field.value().size()), ',')) {
      v = absl::StripAsciiWhitespace(v);
      if (!first_length) first_length = v;
      if (v != *first_length) {
        return HttpRefusal{400, "malformed HTTP request: Content-Length values that differ"};
      }
    }
  }
  if (const auto length = parser.content_length();
      length && *length > static_cast<uint64_t>(limits.max_body_bytes)) {
    return HttpRefusal{413, absl::StrCat("request body of ", *length,
                                         " bytes exceeds --http_max_body_bytes=",
                                         limits.max_body_bytes)};
  }
  return std::nullopt;
}

int64_t HttpInputBufferBytes(const HttpParseLimits& limits) {
  return int64_t{limits.max_header_bytes} + (int64_t{64} << 10);
}

std::optional<HttpRefusal> RefusalForParseError(beast::error_code ec,
                                                const HttpParseLimits& limits) {
  if (ec == http::error::end_of_stream) return std::nullopt;
  if (ec == http::error::buffer_overflow) {
    return HttpRefusal{400, absl::StrCat("malformed HTTP request: a chunk-size line or trailer "
                                         "section not ended within ",
                                         HttpInputBufferBytes(limits), " bytes")};
  }
  if (ec == http::error::body_limit) {
    return HttpRefusal{413, absl::StrCat("request body exceeds --http_max_body_bytes=",
                                         limits.max_body_bytes)};
  }
  if (ec == http::error::header_limit) {
    return HttpRefusal{431, HeaderLimitMessage(limits)};
  }
  if (ec.category() == http::make_error_code(http::error::end_of_stream).category()) {
    return HttpRefusal{400, absl::StrCat("malformed HTTP request: ", ec.message())};
  }
  return std::nullopt;
}

HttpRequest ToHttpRequest(http::request<http::string_body>&& msg) {
  HttpRequest request;
  request.keep_alive = msg.keep_alive();
  request.method = std::string(msg.method_string());
  const auto target = msg.target();
  const size_t q = target.find('?');
  request.path = std::string(target.substr(0, q));
  if (q != decltype(target)::npos) request.query = std::string(target.substr(q + 1));
  for (const auto& field : msg) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(msg.body());
  return request;
}

namespace {

// The connection's input: what has arrived (the buffer the parser reads from) and what has
// not yet (the second read).
struct Input {
  std::string buffer;
  absl::string_view later;

  // One socket read; false when nothing more will come.
  bool Read() {
    if (later.empty()) return false;
    buffer.append(later.data(), later.size());
    later = {};
    return true;
  }
};

enum class Step { kDone, kError, kIncomplete };

// http::async_read_header (header_only) or http::async_read: put whatever is buffered, read
// more while the parser needs more, until the header (or the message) is done. `used` counts
// the bytes the parser took, as the read's completion reports them.
Step ReadUntil(HttpRequestParser& parser, Input& in, bool header_only, beast::error_code& ec,
               size_t& used_total) {
  used_total = 0;
  parser.eager(!header_only);
  for (;;) {
    if (header_only ? parser.is_header_done() : parser.is_done()) return Step::kDone;
    if (!in.buffer.empty()) {
      const size_t used =
          parser.put(boost::asio::buffer(in.buffer.data(), in.buffer.size()), ec);
      in.buffer.erase(0, used);
      used_total += used;
      if (!ec) continue;
      if (ec != http::error::need_more) return Step::kError;
      ec = {};
    }
    if (!in.Read()) return Step::kIncomplete;
  }
}

}  // namespace

HttpParseResult ParseHttpRequests(absl::string_view bytes, const HttpParseLimits& limits,
                                  size_t split) {
  split = std::min(split, bytes.size());
  Input in{std::string(bytes.substr(0, split)), bytes.substr(split)};
  HttpParseResult result;
  for (;;) {
    // The server waits for a next request's first byte before it starts one.
    if (in.buffer.empty() && !in.Read()) return result;
    HttpChunkBudget budget;  // outlives the parser, which calls it by reference
    HttpRequestParser parser;
    ConfigureHttpParser(parser, limits);
    beast::error_code ec;
    size_t header_bytes = 0;
    Step step = ReadUntil(parser, in, /*header_only=*/true, ec, header_bytes);
    if (step == Step::kDone) {
      if (auto refusal = CheckHttpHeader(parser, header_bytes, limits)) {
        result.refusal = std::move(refusal);
        return result;
      }
      ArmHttpBodyLimit(parser, limits, budget);
      size_t body_bytes = 0;
      step = ReadUntil(parser, in, /*header_only=*/false, ec, body_bytes);
    }
    if (step == Step::kIncomplete) {
      result.incomplete = true;
      return result;
    }
    if (step == Step::kError) {
      result.refusal = RefusalForParseError(ec, limits);
      if (!result.refusal) result.incomplete = true;  // not reached: put gives HTTP errors only
      return result;
    }
    result.requests.push_back(ToHttpRequest(parser.release()));
    result.consumed_bytes = bytes.size() - in.buffer.size() - in.later.size();
    if (!result.requests.back().keep_alive) {
      result.ignored_bytes = in.buffer.size() + in.later.size();
      return result;
    }
  }
}

}  // namespace modserve::server
