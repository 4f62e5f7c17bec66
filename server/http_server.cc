// HttpServer on Boost.Beast and Asio. Each connection is a small state machine on its strand:
// read headers (deadline), read body (deadline, size limit), hand the request over, and while
// the response is pending keep one read outstanding on the socket, which completes at once when
// the client disconnects (so the request is cancelled the moment it happens, not at the next
// write) and otherwise keeps any pipelined bytes for the next request. One write is in flight at
// a time; later writes merge behind it.
#include "server/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "server/http_parse_beast.h"

namespace modserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

namespace {

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

std::string StatusLine(int status) {
  const beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
  return absl::StrCat("HTTP/1.1 ", status, " ", absl::string_view(reason.data(), reason.size()),
                      "\r\n");
}

class Connection;

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandler handler;
  // Outlives every connection: Stop() lets the I/O threads finish each connection's handlers
  // before it returns, and the owner releases its exchanges before destroying the server.
  std::unique_ptr<net::io_context> ioc = std::make_unique<net::io_context>();
  std::shared_ptr<ssl::context> tls;  // null = plaintext
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<int32_t> num_connections{0};
  int port = 0;

  std::mutex mu;
  std::list<std::weak_ptr<Connection>> connections;  // for Stop
  bool stopped = false;

  void Accept();
};

namespace {

// Everything but the stream type; the two stream types (plain, TLS) derive from it.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Impl* server, net::any_io_executor executor)
      : server_(server),
        options_(server->options),
        limits_{server->options.max_body_bytes, server->options.max_header_bytes},
        executor_(executor),
        read_timer_(executor),
        write_timer_(executor),
        buffer_(static_cast<size_t>(HttpInputBufferBytes(limits_))) {}
  virtual ~Connection() = default;

  void Start() {
    server_->num_connections.fetch_add(1);
    counted_ = true;
    Handshake();
  }

  // Strand only.
  void Close() {
    if (closed_) return;
    closed_ = true;
    read_timer_.cancel();
    write_timer_.cancel();
    CloseSocket();
    RunOnClose();  // before the count drops: a caller seeing the count sees the cancel done
    if (counted_) server_->num_connections.fetch_sub(1);
    counted_ = false;
  }

  void Post(std::function<void()> task) {
    net::post(executor_, [self = shared_from_this(), task = std::move(task)] { task(); });
  }
  void PostClose() {
    net::post(executor_, [self = shared_from_this()] { self->Close(); });
  }

  // The exchange's operations, keyed by the exchange's number (a stale exchange is ignored).
  bool Current(uint64_t id) const { return !closed_ && id == exchange_id_ && !response_done_; }
  void Reply(uint64_t id, int status, absl::string_view content_type, std::string body,
             const HttpHeaders& headers) {
    if (!Current(id) || response_started_) return;
    response_started_ = true;
    response_done_ = true;
    std::string out = StatusLine(status);
    absl::StrAppend(&out, "Content-Type: ", content_type, "\r\nContent-Length: ", body.size(),
                    "\r\n", keep_alive_ ? "" : "Connection: close\r\n");
    for (const auto& [k, v] : headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
    out += "\r\n";
    out += body;
    Send(std::move(out));
  }
  void StartStream(uint64_t id, int status, absl::string_view content_type,
                   const HttpHeaders& headers) {
    if (!Current(id) || response_started_) return;
    response_started_ = true;
    streaming_ = true;
    std::string out = StatusLine(status);
    absl::StrAppend(&out, "Content-Type: ", content_type,
                    "\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n",
                    keep_alive_ ? "" : "Connection: close\r\n");
    for (const auto& [k, v] : headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
    out += "\r\n";
    Send(std::move(out));
  }
  void Write(uint64_t id, absl::string_view data) {
    if (!Current(id) || !streaming_ || data.empty()) return;
    Send(absl::StrFormat("%x\r\n", data.size()) + std::string(data) + "\r\n");
  }
  void End(uint64_t id) {
    if (!Current(id) || !streaming_) return;
    response_done_ = true;
    Send("0\r\n\r\n");
  }
  void SetOnClose(uint64_t id, std::function<void()> on_close) {
    if (id != exchange_id_ || response_done_) return;
    if (closed_) {
      on_close();
      return;
    }
    on_close_ = std::move(on_close);
  }
  bool Closed(uint64_t id) const { return closed_ || id != exchange_id_; }

 protected:
  // The stream-specific parts.
  virtual void Handshake() = 0;
  virtual void AsyncReadHeader() = 0;
  virtual void AsyncReadBody() = 0;
  virtual void AsyncReadSome() = 0;
  virtual void AsyncWrite() = 0;
  virtual void CloseSocket() = 0;
  virtual bool tls() const = 0;

  enum class Phase { kHandshake, kHeader, kBody, kHandling, kIdle };

  // Each arming has a number, so a wait that fired just before it was re-armed or cancelled
  // (its handler already queued with success) is recognised as stale.
  void ArmReadTimer(absl::Duration d) {
    const uint64_t gen = ++read_timer_gen_;
    read_timer_.expires_after(ToChrono(d));
    read_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->read_timer_gen_) return;
      self->OnReadTimeout();
    });
  }
  void CancelReadTimer() {
    ++read_timer_gen_;
    read_timer_.cancel();
  }

  void OnReadTimeout() {
    if (closed_) return;
    // A request that started arriving gets its 408; an idle keep-alive connection just closes.
    const bool partial = phase_ == Phase::kBody ||
                         (phase_ == Phase::kHeader && (buffer_.size() > 0 || parser_->got_some()));
    if (partial && !tls()) {
      // Cancel the read, then answer from its completion (plain sockets resume cleanly).
      read_timed_out_ = true;
      CancelSocket();
      return;
    }
    Close();
  }
  virtual void CancelSocket() = 0;

  void ReadHeader() {
    if (closed_) return;
    phase_ = Phase::kHeader;
    parser_.emplace();
    ConfigureHttpParser(*parser_, limits_);
    ArmReadTimer(options_.header_timeout);
    reading_ = true;
    AsyncReadHeader();
  }

  // Refusals this layer makes: the answer, then the connection closes.
  void Refuse(int status, absl::string_view message, absl::string_view type) {
    keep_alive_ = false;
    ++exchange_id_;
    response_started_ = true;
    response_done_ = true;
    const std::string body = HttpErrorBody(message, type);
    Send(absl::StrCat(StatusLine(status), "Content-Type: application/json\r\nContent-Length: ",
                      body.size(), "\r\nConnection: close\r\n\r\n", body));
  }

  void OnHeader(beast::error_code ec, size_t header_bytes) {
    reading_ = false;
    if (closed_) return;
    CancelReadTimer();
    if (ec) return OnReadError(ec);
    if (const auto refusal = CheckHttpHeader(*parser_, header_bytes, limits_)) {
      return Refuse(refusal->status, refusal->message, "invalid_request_error");
    }
    ArmHttpBodyLimit(*parser_, limits_, chunk_budget_);
    const auto& header = parser_->get();
    if (absl::EqualsIgnoreCase(
            absl::string_view(header[http::field::expect].data(), header[http::field::expect].size()),
            "100-continue")) {
      Send("HTTP/1.1 100 Continue\r\n\r\n");
    }
    phase_ = Phase::kBody;
    ArmReadTimer(options_.body_timeout);
    reading_ = true;
    AsyncReadBody();
  }

  void OnReadError(beast::error_code ec) {
    if (read_timed_out_) {
      read_timed_out_ = false;
      return Refuse(408,
                    phase_ == Phase::kBody
                        ? absl::StrCat("the request body did not arrive within --http_body_timeout=",
                                       absl::FormatDuration(options_.body_timeout))
                        : absl::StrCat("the request headers did not arrive within "
                                       "--http_header_timeout=",
                                       absl::FormatDuration(options_.header_timeout)),
                    "invalid_request_error");
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == ssl::error::stream_truncated) {
      return Close();
    }
    if (const auto refusal = RefusalForParseError(ec, limits_)) {
      return Refuse(refusal->status, refusal->message, "invalid_request_error");
    }
    Close();
  }

  void OnBody(beast::error_code ec) {
    reading_ = false;
    if (closed_) return;
    CancelReadTimer();
    if (ec) return OnReadError(ec);
    HttpRequest request = ToHttpRequest(parser_->release());
    parser_.reset();
    keep_alive_ = request.keep_alive;
    phase_ = Phase::kHandling;
    ++exchange_id_;
    response_started_ = false;
    response_done_ = false;
    streaming_ = false;
    WatchForDisconnect();
    server_->handler(request, MakeExchange());
  }

  std::shared_ptr<HttpExchange> MakeExchange();

  // While a request is handled: one read outstanding, which ends at once if the client goes.
  // Bytes already buffered are a pipelined request (the client is there): no watch then, so the
  // next request can be parsed as soon as this one is answered.
  void WatchForDisconnect() {
    if (reading_ || closed_ || buffer_.size() > 0) return;
    reading_ = true;
    AsyncReadSome();
  }

  void OnReadSome(beast::error_code ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      // EOF or reset while a response is pending or the connection idles: the client is gone.
      return Close();
    }
    buffer_.commit(n);
    if (phase_ == Phase::kIdle) ReadHeader();
  }

  void Send(std::string bytes) {
    if (closed_) return;
    pending_ += bytes;
    if (!writing_) StartWrite();
  }

  void StartWrite() {
    in_flight_.swap(pending_);
    pending_.clear();
    writing_ = true;
    const uint64_t gen = ++write_timer_gen_;
    write_timer_.expires_after(ToChrono(options_.write_timeout));
    write_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (!ec && gen == self->write_timer_gen_) self->Close();  // the client stopped reading
    });
    AsyncWrite();
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    ++write_timer_gen_;
    write_timer_.cancel();
    if (closed_) return;
    if (ec) return Close();
    in_flight_.clear();
    if (!pending_.empty()) return StartWrite();
    if (response_done_ && phase_ != Phase::kIdle) ResponseComplete();
  }

  void ResponseComplete() {
    on_close_ = nullptr;  // complete: nothing to cancel any more
    if (!keep_alive_) return Close();
    phase_ = Phase::kIdle;
    if (!reading_ && buffer_.size() > 0) return ReadHeader();  // a pipelined request
    // Idle until the next request's first bytes (the disconnect watch, if still out, is the
    // read that gets them).
    ArmReadTimer(options_.idle_timeout);
    if (!reading_) {
      reading_ = true;
      AsyncReadSome();
    }
  }

  void RunOnClose() {
    std::function<void()> f = std::move(on_close_);
    on_close_ = nullptr;
    if (f && !response_done_) f();
  }

  HttpServer::Impl* server_;
  const HttpServerOptions& options_;
  const HttpParseLimits limits_;
  net::any_io_executor executor_;
  net::steady_timer read_timer_;
  net::steady_timer write_timer_;
  beast::flat_buffer buffer_;     // at most HttpInputBufferBytes: past it, Beast's buffer_overflow
  HttpChunkBudget chunk_budget_;  // declared first: parser_ calls it by reference
  std::optional<HttpRequestParser> parser_;
  Phase phase_ = Phase::kHandshake;
  bool closed_ = false;
  bool counted_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool read_timed_out_ = false;
  uint64_t read_timer_gen_ = 0;
  uint64_t write_timer_gen_ = 0;
  bool keep_alive_ = true;
  uint64_t exchange_id_ = 0;
  bool response_started_ = false;
  bool response_done_ = false;
  bool streaming_ = false;
  std::function<void()> on_close_;
  std::string pending_;    // bytes behind the write in flight
  std::string in_flight_;  // owned by the write in flight
};

class Exchange final : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Connection> conn, uint64_t id) : conn_(std::move(conn)), id_(id) {}
  void Reply(int status, absl::string_view content_type, std::string body,
             const HttpHeaders& headers) override {
    conn_->Reply(id_, status, content_type, std::move(body), headers);
  }
  void StartStream(int status, absl::string_view content_type,
                   const HttpHeaders& headers) override {
    conn_->StartStream(id_, status, content_type, headers);
  }
  void Write(absl::string_view data) override { conn_->Write(id_, data); }
  void End() override { conn_->End(id_); }
  void Post(std::function<void()> task) override { conn_->Post(std::move(task)); }
  void OnClose(std::function<void()> on_close) override {
    conn_->SetOnClose(id_, std::move(on_close));
  }
  bool closed() const override { return conn_->Closed(id_); }

 private:
  std::shared_ptr<Connection> conn_;
  const uint64_t id_;
};

std::shared_ptr<HttpExchange> Connection::MakeExchange() {
  return std::make_shared<Exchange>(shared_from_this(), exchange_id_);
}

class PlainConnection final : public Connection {
 public:
  PlainConnection(HttpServer::Impl* server, tcp::socket socket)
      : Connection(server, socket.get_executor()), socket_(std::move(socket)) {}

 private:
  bool tls() const override { return false; }
  void Handshake() override { ReadHeader(); }
  void AsyncReadHeader() override {
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = Self()](beast::error_code ec, size_t n) { self->OnHeader(ec, n); });
  }
  void AsyncReadBody() override {
    http::async_read(socket_, buffer_, *parser_,
                     [self = Self()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }
  void AsyncReadSome() override {
    socket_.async_read_some(buffer_.prepare(4096), [self = Self()](beast::error_code ec, size_t n) {
      self->OnReadSome(ec, n);
    });
  }
  void AsyncWrite() override {
    net::async_write(socket_, net::buffer(in_flight_),
                     [self = Self()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }
  void CancelSocket() override {
    beast::error_code ignored;
    socket_.cancel(ignored);
  }
  void CloseSocket() override {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }
  std::shared_ptr<PlainConnection> Self() {
    return std::static_pointer_cast<PlainConnection>(shared_from_this());
  }

  tcp::socket socket_;
};

class TlsConnection final : public Connection {
 public:
  TlsConnection(HttpServer::Impl* server, tcp::socket socket, ssl::context& context)
      : Connection(server, socket.get_executor()), stream_(std::move(socket), context) {}

 private:
  bool tls() const override { return true; }
  void Handshake() override {
    ArmReadTimer(options_.header_timeout);
    stream_.async_handshake(ssl::stream_base::server, [self = Self()](beast::error_code ec) {
      self->CancelReadTimer();
      if (ec || self->closed_) return self->Close();
      self->ReadHeader();
    });
  }
  void AsyncReadHeader() override {
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = Self()](beast::error_code ec, size_t n) { self->OnHeader(ec, n); });
  }
  void AsyncReadBody() override {
    http::async_read(stream_, buffer_, *parser_,
                     [self = Self()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }
  void AsyncReadSome() override {
    stream_.async_read_some(buffer_.prepare(4096), [self = Self()](beast::error_code ec, size_t n) {
      self->OnReadSome(ec, n);
    });
  }
  void AsyncWrite() override {
    net::async_write(stream_, net::buffer(in_flight_),
                     [self = Self()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }
  void CancelSocket() override { CloseSocket(); }
  void CloseSocket() override {
    // No TLS close_notify: the connection is being dropped (timeout, disconnect, stop).
    beast::error_code ignored;
    stream_.next_layer().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.next_layer().close(ignored);
  }
  std::shared_ptr<TlsConnection> Self() {
    return std::static_pointer_cast<TlsConnection>(shared_from_this());
  }

  ssl::stream<tcp::socket> stream_;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(*ioc), [this](beast::error_code ec, tcp::socket socket) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopped) return;
    }
    if (!ec) {
      // Token events are small writes: Nagle's algorithm would hold each behind the ACK of the
      // last (up to a delayed-ACK timeout, 40 ms on Linux).
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (num_connections.load() >= options.max_connections) {
        socket.close(ignored);
      } else {
        std::shared_ptr<Connection> conn;
        if (tls != nullptr) {
          conn = std::make_shared<TlsConnection>(this, std::move(socket), *tls);
        } else {
          conn = std::make_shared<PlainConnection>(this, std::move(socket));
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          connections.remove_if([](const std::weak_ptr<Connection>& w) { return w.expired(); });
          connections.push_back(conn);
        }
        conn->Post([conn] { conn->Start(); });
      }
    }
    Accept();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handler = std::move(handler);
  if (!options.tls.cert_file.empty()) {
    MODSERVE_ASSIGN_OR_RETURN(std::string cert,
                              ReadCredentialFile("--tls_cert_file", options.tls.cert_file));
    MODSERVE_ASSIGN_OR_RETURN(std::string key,
                              ReadCredentialFile("--tls_key_file", options.tls.key_file));
    auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
    beast::error_code ec;
    context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                             ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                             ssl::context::no_tlsv1_1,
                         ec);
    context->use_certificate_chain(net::buffer(cert), ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_cert_file '", options.tls.cert_file,
                                                     "': ", ec.message()));
    }
    context->use_private_key(net::buffer(key), ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_key_file '", options.tls.key_file, "': ", ec.message()));
    }
    if (!options.tls.client_ca_file.empty()) {
      MODSERVE_ASSIGN_OR_RETURN(std::string ca, ReadCredentialFile("--tls_client_ca_file",
                                                                   options.tls.client_ca_file));
      context->add_certificate_authority(net::buffer(ca), ec);
      if (ec) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--tls_client_ca_file '", options.tls.client_ca_file, "': ", ec.message()));
      }
      context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
    impl->tls = std::move(context);
  }
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(options.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_host '", options.host, "' is not an IP address: ", ec.message()));
  }
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options.port));
  impl->acceptor.emplace(*impl->ioc);
  impl->acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor->bind(endpoint, ec);
  if (!ec) impl->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host, ":",
                                               options.port, " (http): ", ec.message()));
  }
  impl->port = impl->acceptor->local_endpoint().port();
  impl->Accept();
  const int threads = std::max(1, options.num_threads);
  for (int i = 0; i < threads; ++i) {
    impl->threads.emplace_back([ioc = impl->ioc.get()] { ioc->run(); });
    pthread_setname_np(impl->threads.back().native_handle(), "modserve-http");
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }
int32_t HttpServer::num_connections() const { return impl_->num_connections.load(); }

void HttpServer::Stop() {
  std::list<std::weak_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
    connections.swap(impl_->connections);
  }
  net::post(*impl_->ioc, [this] {
    beast::error_code ignored;
    impl_->acceptor->close(ignored);
  });
  for (const std::weak_ptr<Connection>& w : connections) {
    if (std::shared_ptr<Connection> conn = w.lock()) conn->PostClose();
  }
  // With the acceptor and every connection closed, run() returns once their last handlers have
  // run; tasks posted after that are dropped with the io_context.
  for (std::thread& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace modserve::server
