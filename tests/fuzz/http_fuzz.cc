// Fuzz target for the HTTP port's request framing: raw connection bytes (request lines, headers,
// Content-Length and chunked bodies, pipelined requests) through server::ParseHttpRequests, the
// Beast parser configuration and refusals the server itself uses. The properties are written
// from the server's documented limits, not from Beast's code.
#include <algorithm>
#include <cstring>
#include <vector>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "server/http_parse.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_util.h"

namespace modserve::fuzz {
namespace {

// RFC 9110 tchar.
bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u)) continue;
    if (std::strchr("!#$%&'*+-.^_`|~", c) == nullptr || c == '\0') return false;
  }
  return true;
}

std::string Describe(const server::HttpRequest& r) {
  std::string out = absl::StrCat(Escape(r.method, 40), " ", Escape(r.path, 80), "?",
                                 Escape(r.query, 40), " keep_alive=", r.keep_alive);
  for (const auto& [k, v] : r.headers) absl::StrAppend(&out, " [", Escape(k, 40), ": ", Escape(v, 60), "]");
  absl::StrAppend(&out, " body(", r.body.size(), ")=", Escape(r.body, 60));
  return out;
}

std::string Describe(const server::HttpParseResult& r) {
  std::string out = absl::StrCat(r.requests.size(), " request(s)");
  for (const auto& q : r.requests) absl::StrAppend(&out, "\n  ", Describe(q));
  if (r.refusal) absl::StrAppend(&out, "\n  refused ", r.refusal->status, ": ", r.refusal->message);
  absl::StrAppend(&out, "\n  incomplete=", r.incomplete, " ignored_bytes=", r.ignored_bytes);
  return out;
}

bool SameRequest(const server::HttpRequest& a, const server::HttpRequest& b) {
  return a.method == b.method && a.path == b.path && a.query == b.query &&
         a.headers == b.headers && a.body == b.body && a.keep_alive == b.keep_alive;
}

bool SameResult(const server::HttpParseResult& a, const server::HttpParseResult& b) {
  if (a.requests.size() != b.requests.size()) return false;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    if (!SameRequest(a.requests[i], b.requests[i])) return false;
  }
  return a.refusal == b.refusal && a.incomplete == b.incomplete &&
         a.ignored_bytes == b.ignored_bytes && a.consumed_bytes == b.consumed_bytes;
}

// The split dependence ParseHttpRequests documents (Beast's): after the same complete requests,
// a malformed or oversized header may be refused (400, 431) in one read and wait for more (then
// 431, or the timeout's 408) when a read boundary falls inside it, or the other way round. Which requests are accepted never depends on the split, and neither side may accept
// what the other refuses.
bool SameUpToMalformedHeader(const server::HttpParseResult& a, const server::HttpParseResult& b) {
  if (a.requests.size() != b.requests.size() || a.consumed_bytes != b.consumed_bytes) return false;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    if (!SameRequest(a.requests[i], b.requests[i])) return false;
  }
  const auto malformed_or_waiting = [](const server::HttpParseResult& r) {
    return (r.refusal && r.refusal->status != 413) || r.incomplete;
  };
  return malformed_or_waiting(a) && malformed_or_waiting(b);
}

void CheckRequest(const server::HttpRequest& r, const server::HttpParseLimits& limits) {
  const std::string d = Describe(r);
  FUZZ_CHECK(IsToken(r.method), "method is not a token: " + d);
  FUZZ_CHECK(static_cast<int64_t>(r.body.size()) <= limits.max_body_bytes,
             "body over --http_max_body_bytes: " + d);
  // What the request line and headers must at least have taken on the wire (values as parsed
  // are never longer than they were sent: whitespace is trimmed, folds joined).
  size_t header_bytes = r.method.size() + 1 + r.path.size() + (r.query.empty() ? 0 : 1) +
                        r.query.size() + sizeof(" HTTP/1.1\r\n") - 1 + 2;
  for (const auto& [name, value] : r.headers) {
    FUZZ_CHECK(IsToken(name), "header name is not a token: " + d);
    FUZZ_CHECK(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
               "header value carries CR, LF or NUL: " + d);
    header_bytes += name.size() + 1 + value.size() + 2;
  }
  FUZZ_CHECK(header_bytes <= static_cast<size_t>(limits.max_header_bytes),
             absl::StrCat("request line + headers (at least ", header_bytes,
                          " bytes) over the header limit ", limits.max_header_bytes, ": ", d));
  // A Content-Length body (and no Transfer-Encoding, which overrides it or is refused) is
  // exactly that long. RFC 9110 8.6 lets a recipient take a list of identical values ("5, 5",
  // or the header repeated) as that one value; anything else must have been refused.
  const std::vector<absl::string_view> lengths = r.Headers("Content-Length");
  if (r.Headers("Transfer-Encoding").empty() && !lengths.empty()) {
    std::vector<absl::string_view> values;
    for (absl::string_view v : lengths) {
      for (absl::string_view e : absl::StrSplit(v, ',')) values.push_back(absl::StripAsciiWhitespace(e));
    }
    uint64_t n = 0;
    FUZZ_CHECK(std::all_of(values.begin(), values.end(),
                           [&](absl::string_view v) { return v == values[0]; }),
               "conflicting Content-Length values accepted: " + d);
    FUZZ_CHECK(!values[0].empty() && absl::ascii_isdigit(static_cast<unsigned char>(values[0][0])) &&
                   absl::SimpleAtoi(values[0], &n),
               "unparsable Content-Length accepted: " + d);
    FUZZ_CHECK(n == r.body.size(), "body length differs from Content-Length: " + d);
  }
}

void CheckResult(const server::HttpParseResult& r, const server::HttpParseLimits& limits,
                 size_t bytes_size) {
  const std::string d = Describe(r);
  FUZZ_CHECK(!(r.refusal && r.incomplete), "both refused and incomplete: " + d);
  FUZZ_CHECK(r.consumed_bytes + r.ignored_bytes <= bytes_size, "consumed past the input: " + d);
  FUZZ_CHECK(r.ignored_bytes == 0 || (!r.requests.empty() && !r.requests.back().keep_alive),
             "bytes ignored after a keep-alive request: " + d);
  for (size_t i = 0; i < r.requests.size(); ++i) {
    CheckRequest(r.requests[i], limits);
    FUZZ_CHECK(r.requests[i].keep_alive || i + 1 == r.requests.size(),
               "a request read after one that closes the connection: " + d);
  }
  if (!r.requests.empty() && !r.requests.back().keep_alive) {
    FUZZ_CHECK(!r.refusal && !r.incomplete, "input read past a closing request: " + d);
  }
  if (r.refusal) {
    const int s = r.refusal->status;
    FUZZ_CHECK(s == 400 || s == 413 || s == 431, "refusal status not 400/413/431: " + d);
    FUZZ_CHECK(!r.refusal->message.empty(), "refusal without a message: " + d);
    if (s == 413) {
      FUZZ_CHECK(absl::StrContains(r.refusal->message,
                                   absl::StrCat("--http_max_body_bytes=", limits.max_body_bytes)),
                 "413 does not name the body limit: " + d);
    }
    if (s == 431) {
      FUZZ_CHECK(absl::StrContains(r.refusal->message, absl::StrCat(limits.max_header_bytes)),
                 "431 does not name the header limit: " + d);
    }
    // The body the server sends is OpenAI's error object carrying the message.
    const std::string body = server::HttpErrorBody(r.refusal->message);
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    FUZZ_CHECK(!j.is_discarded() && j.is_object() && j.contains("error") &&
                   j["error"].is_object() && j["error"].value("message", "") == r.refusal->message &&
                   j["error"].value("type", "") == "invalid_request_error",
               "refusal body is not the error object: " + Escape(body));
  }
}

}  // namespace

int FuzzHttpRequest(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  // Byte 0: limits (bit 0: small ones a short input can reach; otherwise the server's
  // defaults). Bytes 1-2: where the input splits into two reads.
  server::HttpParseLimits limits;
  if (data[0] & 1) {
    limits.max_body_bytes = 1 + (data[0] >> 1) % 64;
    limits.max_header_bytes = 64 + 4 * (data[0] >> 1);
  }
  const size_t split_seed = data[1] | (size_t{data[2]} << 8);
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 3), size - 3);
  const size_t split = split_seed % (bytes.size() + 1);

  const server::HttpParseResult whole = server::ParseHttpRequests(bytes, limits, bytes.size());
  CheckResult(whole, limits, bytes.size());
  const server::HttpParseResult parts = server::ParseHttpRequests(bytes, limits, split);
  FUZZ_CHECK(SameResult(whole, parts) || SameUpToMalformedHeader(whole, parts),
             absl::StrCat("split at ", split, " changes the result:\nwhole: ", Describe(whole),
                          "\nsplit: ", Describe(parts), "\ninput: ", Escape(std::string_view(bytes.data(), bytes.size()), 400)));
  return 0;
}

}  // namespace modserve::fuzz
