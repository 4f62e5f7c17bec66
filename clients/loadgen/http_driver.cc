// RunHttpLoad: blocking Beast clients, one thread per slot. A thread waking per TCP segment is
// what gRPC's callback threads cost too, so the two modes load the machine alike.
#include "clients/loadgen/http_driver.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <sys/socket.h>

#include <chrono>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace modserve::loadgen {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct SlotResult {
  std::vector<double> ttft, itl;
  int64_t tokens = 0;
  std::map<std::string, int> errors;
};

// One request on `socket`; appends to `out`. False when the connection is unusable after it.
bool OneRequest(tcp::socket& socket, beast::flat_buffer& buffer, const std::string& host,
                const std::string& body, SlotResult* out) {
  http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
  req.set(http::field::host, host);
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = body;
  req.prepare_payload();
  const Clock::time_point start = Clock::now();
  beast::error_code ec;
  http::write(socket, req, ec);
  if (ec) {
    ++out->errors[ec.message()];
    return false;
  }
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  std::string pending;  // the unfinished event
  std::optional<Clock::time_point> last;
  std::vector<double> itl;
  double ttft = 0.0;
  int64_t tokens = 0;
  auto on_chunk = [&](std::uint64_t, beast::string_view data, beast::error_code&) {
    const Clock::time_point now = Clock::now();
    pending.append(data.data(), data.size());
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const bool token = pending.compare(0, 6, "data: ") == 0 &&
                         pending.find("\"finish_reason\":null") < end;
      pending.erase(0, end + 2);
      if (!token) continue;
      if (last) {
        itl.push_back(Seconds(*last, now));
      } else {
        ttft = Seconds(start, now);
      }
      last = now;
      ++tokens;
    }
    return data.size();
  };
  parser.on_chunk_body(on_chunk);
  http::read(socket, buffer, parser, ec);
  out->tokens += tokens;
  if (ec) {
    ++out->errors[ec.message()];
    return false;
  }
  if (parser.get().result_int() != 200) {
    ++out->errors[absl::StrCat("HTTP ", parser.get().result_int())];
  } else {
    out->ttft.push_back(ttft);
    out->itl.insert(out->itl.end(), itl.begin(), itl.end());
  }
  return parser.get().keep_alive();
}

}  // namespace

HttpLoadResult RunHttpLoad(const std::string& host_port, const std::vector<std::string>& bodies,
                           int32_t concurrency, int32_t total, absl::Duration timeout) {
  HttpLoadResult result;
  const size_t colon = host_port.rfind(':');
  const std::string host = host_port.substr(0, colon);
  const std::string port = colon == std::string::npos ? "80" : host_port.substr(colon + 1);
  std::atomic<int32_t> next{0};
  std::mutex mu;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int32_t t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      net::io_context ioc;
      tcp::resolver resolver(ioc);
      SlotResult mine;
      std::optional<tcp::socket> socket;
      beast::flat_buffer buffer;
      for (int32_t i; (i = next.fetch_add(1)) < total;) {
        if (!socket) {
          beast::error_code ec;
          socket.emplace(ioc);
          net::connect(*socket, resolver.resolve(host, port, ec), ec);
          if (ec) {
            ++mine.errors[ec.message()];
            socket.reset();
            continue;
          }
          socket->set_option(tcp::no_delay(true));
          const auto ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
          const struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
          setsockopt(socket->native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
          buffer.clear();
        }
        if (!OneRequest(*socket, buffer, host, bodies[static_cast<size_t>(i) % bodies.size()],
                        &mine)) {
          socket.reset();
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      result.ttft.insert(result.ttft.end(), mine.ttft.begin(), mine.ttft.end());
      result.itl.insert(result.itl.end(), mine.itl.begin(), mine.itl.end());
      result.tokens += mine.tokens;
      for (const auto& [k, v] : mine.errors) result.errors[k] += v;
    });
  }
  for (std::thread& t : threads) t.join();
  result.wall_seconds = Seconds(start, Clock::now());
  result.issued = std::min(next.load(), total);
  return result;
}

}  // namespace modserve::loadgen
