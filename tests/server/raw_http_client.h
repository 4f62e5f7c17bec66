// A blocking loopback HTTP client for tests: raw bytes out, raw bytes in, so that malformed,
// slow and vanishing clients can be played byte by byte; plus response counting and SSE
// helpers. Test-only: no TLS, no parsing beyond what the tests need.
#ifndef MODSERVE_TESTS_SERVER_RAW_HTTP_CLIENT_H_
#define MODSERVE_TESTS_SERVER_RAW_HTTP_CLIENT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace modserve::server::testing {

// A blocking loopback client: send bytes, read until a condition or a deadline.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() { Close(); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  // Reads until `done(received)` or the peer closes or `timeout` passes; returns what came.
  template <typename Done>
  std::string ReadUntil(Done done, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done(received_) && !eof_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        eof_ = true;
        break;
      }
      received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }
  std::string ReadResponses(int count) {
    return ReadUntil([count](const std::string& r) { return CountResponses(r) >= count; });
  }
  bool WaitClosed(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    ReadUntil([](const std::string&) { return false; }, timeout);
    return eof_;
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  void TakeReceived() { received_.clear(); }

  // Complete responses (status line, headers, Content-Length body or chunked body) in `r`.
  static int CountResponses(const std::string& r) {
    int count = 0;
    size_t pos = 0;
    for (;;) {
      const size_t head_end = r.find("\r\n\r\n", pos);
      if (head_end == std::string::npos) return count;
      const std::string head = r.substr(pos, head_end - pos);
      size_t body = head_end + 4;
      if (absl::StartsWith(r.substr(pos), "HTTP/1.1 100")) {
        pos = body;
        continue;
      }
      if (head.find("Transfer-Encoding: chunked") != std::string::npos) {
        const size_t last = r.find("\r\n0\r\n\r\n", body - 2);
        if (last == std::string::npos) return count;
        pos = last + 7;
      } else {
        const size_t cl = head.find("Content-Length: ");
        size_t length = 0;
        if (cl != std::string::npos) {
          (void)absl::SimpleAtoi(head.substr(cl + 16, head.find("\r\n", cl) - cl - 16), &length);
        }
        if (r.size() < body + length) return count;
        pos = body + length;
      }
      ++count;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string received_;
};

inline std::string HttpPost(absl::string_view path, absl::string_view body) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(),
                      "\r\n\r\n", body);
}

// The body of the first response in `r` (chunked bodies joined).
inline std::string ResponseBody(const std::string& r) {
  const size_t head_end = r.find("\r\n\r\n");
  if (head_end == std::string::npos) return "";
  const std::string head = r.substr(0, head_end);
  std::string body = r.substr(head_end + 4);
  if (head.find("Transfer-Encoding: chunked") == std::string::npos) return body;
  std::string joined;
  size_t pos = 0;
  for (;;) {
    const size_t line_end = body.find("\r\n", pos);
    if (line_end == std::string::npos) break;
    size_t n = 0;
    if (!absl::SimpleHexAtoi(body.substr(pos, line_end - pos), &n) || n == 0) break;
    joined += body.substr(line_end + 2, n);
    pos = line_end + 2 + n + 2;
  }
  return joined;
}

// The `data: ...` payloads of a server-sent event stream, in order.
inline std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end == std::string::npos ? std::string::npos
                                                                 : end - pos - 6));
    if (end == std::string::npos) break;
    pos = end + 2;
  }
  return out;
}

}  // namespace modserve::server::testing

#endif  // MODSERVE_TESTS_SERVER_RAW_HTTP_CLIENT_H_
