// modserve: the gRPC server binary. Parses flags into ServerOptions/EngineOptions, starts the
// server, prints the bound ports, and drains on SIGTERM (or SIGINT) before exiting 0. A bad
// credential file or limit exits 1 at start-up, naming the flag and the file.
//
//   modserve --model models/demo --port 50051 --metrics_port 9400
//   modserve --model models/demo --host 0.0.0.0 --tls_cert_file server.crt
//       --tls_key_file server.key --auth_token_file token --health_port 50052
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "server/server.h"
#include "tools/cli_usage.h"

ABSL_FLAG(std::string, model, "",
          "checkpoint directory (config.json, safetensors, tokenizer) or a .gguf file");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (0.0.0.0 for every interface)");
ABSL_FLAG(int32_t, port, 50051, "gRPC port; 0 picks a free one (printed on stdout)");
ABSL_FLAG(std::string, metrics_host, "", "address of /metrics; empty = --host");
ABSL_FLAG(int32_t, metrics_port, -1, "Prometheus /metrics port; 0 picks one; -1 = off");
ABSL_FLAG(std::string, health_host, "", "address of the health-only gRPC port; empty = --host");
ABSL_FLAG(int32_t, health_port, -1,
          "plaintext gRPC port serving only grpc.health.v1, with no token or TLS (for probes); "
          "0 picks one; -1 = off (the main port serves health either way)");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM server certificate chain; turns TLS on");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA certificates; when set, clients must present a certificate signed by one");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of accepted bearer tokens, one per line; when set, every ModServe call needs "
          "'authorization: Bearer <token>' metadata (health does not)");
ABSL_FLAG(int32_t, max_prompt_tokens, 0,
          "longest prompt in tokens (OUT_OF_RANGE past it); 0 = the model's max_seq_len");
ABSL_FLAG(int32_t, max_new_tokens, 0,
          "largest stopping.max_new_tokens a request may ask for (OUT_OF_RANGE past it; an unset "
          "one is 16, or this if smaller); 0 = the model's max_seq_len");
ABSL_FLAG(int32_t, max_concurrent_streams, 1024,
          "Generate + GenerateStream calls in flight; more get RESOURCE_EXHAUSTED; 0 = no limit");
ABSL_FLAG(int32_t, max_message_bytes, 4 << 20,
          "largest request message gRPC accepts; larger ones get RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, stream_interval, 1,
          "tokens per stream message after the first, which is sent at once (1 = every token as "
          "it is sampled; more cut per-token gRPC work at the price of burstier streams)");
ABSL_FLAG(int32_t, http_port, -1,
          "OpenAI-compatible HTTP port (/v1/completions, /v1/chat/completions, /v1/models, "
          "/health); 0 picks a free one; -1 = off. Same token, TLS, limits and metrics as gRPC");
ABSL_FLAG(std::string, http_host, "", "address of the HTTP port; empty = --host");
ABSL_FLAG(int32_t, http_threads, 2, "HTTP I/O threads");
ABSL_FLAG(int64_t, http_max_body_bytes, int64_t{4} << 20,
          "largest HTTP request body; larger ones get 413");
ABSL_FLAG(absl::Duration, http_header_timeout, absl::Seconds(10),
          "an HTTP request's headers must arrive within this of the connection (or of the "
          "request's first byte); slower clients get 408 and are closed");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Seconds(30),
          "how long a keep-alive HTTP connection may idle between requests");
ABSL_FLAG(absl::Duration, http_body_timeout, absl::Seconds(30),
          "an HTTP request's body must arrive within this after its headers (else 408)");
ABSL_FLAG(absl::Duration, http_write_timeout, absl::Seconds(30),
          "an HTTP client that does not read a response write for this long is disconnected "
          "(and its request cancelled)");
ABSL_FLAG(int32_t, http_max_connections, 1024, "open HTTP connections; more are closed at once");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's name in the HTTP API; empty = the --model directory or file name");
ABSL_FLAG(std::string, chat_template, "",
          "Jinja chat template file for /v1/chat/completions, instead of the model's own");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads; 0 = every core");
ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, matmul_precision, "highest",
          "how BF16-weight Gemms on AMX tiles may round activations: highest (f32 precision), "
          "high (two bf16 terms, ~2^-16) or medium (bf16, ~2^-8; faster, less accurate)");
ABSL_FLAG(int32_t, max_num_seqs, 16, "sequences in the running batch");
ABSL_FLAG(int32_t, max_batch_tokens, 512, "tokens of one step (decodes plus prefill chunks)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20, "bytes of the paged KV cache");
ABSL_FLAG(int32_t, kv_block_size, 16,
          "tokens per KV cache page (and per prefix-cache block); larger pages read faster on "
          "the CPU, smaller ones round a sequence's (and a MoD routed layer's) KV up by less");
ABSL_FLAG(int32_t, max_queue, 256, "requests waiting for admission; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "on SIGTERM, how long in-flight requests may run before they are ended");
ABSL_FLAG(uint64_t, seed, 0, "seeds the per-request seeds of requests that set none");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache storage: auto (the weights' 16-bit type, else f32), f32, f16 or bf16");
ABSL_FLAG(std::string, prefix_caching, "true",
          "true or false: reuse the KV entries of cached prompt prefixes (same threshold)");
ABSL_FLAG(int32_t, speculative_tokens, 0,
          "self-speculative decoding: tokens drafted per decode step (0 = off, at most 16); "
          "requests may override it");
ABSL_FLAG(double, speculative_threshold, 1.0,
          "the draft's routing threshold in (0, 1]; 1 skips every routed layer");
ABSL_FLAG(std::string, inject_faults, "",
          "for fault-injection tests only: sampler=P,detokenizer=P,backend_step=N,seed=S");

int main(int argc, char** argv) {
  modserve::cli::SetUsage(
      "modserve --model DIR [--port N] [--http_port N] [--metrics_port N] [--health_port N] "
      "[--tls_cert_file F --tls_key_file F [--tls_client_ca_file F]] [--auth_token_file F]",
      __FILE__);
  absl::ParseCommandLine(argc, argv);

  // Block the stop signals in every thread (threads inherit the mask) and take them with
  // sigwait below, so no handler runs at an arbitrary point.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  modserve::engine::EngineOptions eo;
  eo.model_dir = absl::GetFlag(FLAGS_model);
  if (eo.model_dir.empty()) {
    std::cerr << "modserve: --model is required" << std::endl;
    return 2;
  }
  eo.backend = absl::GetFlag(FLAGS_backend);
  eo.num_threads = absl::GetFlag(FLAGS_threads);
  eo.max_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  eo.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  eo.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  eo.block_size = absl::GetFlag(FLAGS_kv_block_size);
  if (eo.block_size < 1) {
    std::cerr << "modserve: --kv_block_size " << eo.block_size << ": must be at least 1"
              << std::endl;
    return 2;
  }
  eo.seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<std::optional<modserve::DType>> kv_dtype =
      modserve::engine::ParseKvDtype(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv_dtype.ok()) {
    std::cerr << "modserve: --kv_cache_dtype: " << kv_dtype.status().message() << std::endl;
    return 2;
  }
  eo.kv_dtype = *kv_dtype;
  absl::StatusOr<modserve::backend::MatmulPrecision> precision =
      modserve::backend::ParseMatmulPrecision(absl::GetFlag(FLAGS_matmul_precision));
  if (!precision.ok()) {
    std::cerr << "modserve: --matmul_precision: " << precision.status().message() << std::endl;
    return 2;
  }
  eo.matmul_precision = *precision;
  if (const std::string v = absl::GetFlag(FLAGS_prefix_caching); v == "true" || v == "false") {
    eo.prefix_caching = v == "true";
  } else {
    std::cerr << "modserve: --prefix_caching: '" << v << "' is not true or false" << std::endl;
    return 2;
  }
  eo.speculative_tokens = absl::GetFlag(FLAGS_speculative_tokens);
  eo.speculative_threshold = absl::GetFlag(FLAGS_speculative_threshold);
  absl::StatusOr<modserve::engine::FaultInjection> faults =
      modserve::engine::ParseFaultInjection(absl::GetFlag(FLAGS_inject_faults));
  if (!faults.ok()) {
    std::cerr << "modserve: --inject_faults: " << faults.status().message() << std::endl;
    return 2;
  }
  eo.faults = *faults;

  modserve::server::ServerOptions so;
  so.host = absl::GetFlag(FLAGS_host);
  so.port = absl::GetFlag(FLAGS_port);
  so.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  so.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  so.health_host = absl::GetFlag(FLAGS_health_host);
  so.health_port = absl::GetFlag(FLAGS_health_port);
  so.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  so.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  so.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  so.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  so.request_limits.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  so.request_limits.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  so.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  so.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  so.stream_interval = absl::GetFlag(FLAGS_stream_interval);
  if (so.stream_interval < 1) {
    std::cerr << "modserve: --stream_interval must be >= 1, got " << so.stream_interval
              << std::endl;
    return 2;
  }
  if (!so.auth_token_file.empty() && so.tls.cert_file.empty()) {
    std::cerr << "modserve: warning: --auth_token_file without --tls_cert_file: tokens cross the "
                 "network in cleartext"
              << std::endl;
  }
  so.http_port = absl::GetFlag(FLAGS_http_port);
  so.http_host = absl::GetFlag(FLAGS_http_host);
  so.http.num_threads = absl::GetFlag(FLAGS_http_threads);
  so.http.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
  so.http.header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
  so.http.body_timeout = absl::GetFlag(FLAGS_http_body_timeout);
  so.http.idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout);
  so.http.write_timeout = absl::GetFlag(FLAGS_http_write_timeout);
  so.http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  so.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  so.chat_template_file = absl::GetFlag(FLAGS_chat_template);
  if (so.http.num_threads < 1 || so.http.max_body_bytes < 1 || so.http.max_connections < 1) {
    std::cerr << "modserve: --http_threads, --http_max_body_bytes and --http_max_connections "
                 "must be >= 1"
              << std::endl;
    return 2;
  }
  so.loop.scheduler.max_num_seqs = eo.max_seqs;
  so.loop.scheduler.max_batch_tokens = eo.max_batch_tokens;
  so.loop.scheduler.max_queue = absl::GetFlag(FLAGS_max_queue);
  so.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);

  auto server = modserve::server::Server::Start(so, eo);
  if (!server.ok()) {
    std::cerr << "modserve: " << server.status() << std::endl;
    return 1;
  }
  std::cout << "modserve listening on " << so.host << ":" << (*server)->port() << std::endl;
  if ((*server)->metrics_port() > 0) {
    std::cout << "modserve metrics on " << (so.metrics_host.empty() ? so.host : so.metrics_host)
              << ":" << (*server)->metrics_port() << "/metrics" << std::endl;
  }
  // The limits, so an operator can match gRPC's own "larger than max (N vs. LIMIT)" to its flag.
  std::cout << "modserve limits: --max_prompt_tokens=" << so.request_limits.max_prompt_tokens
            << " --max_new_tokens=" << so.request_limits.max_new_tokens
            << " --max_concurrent_streams=" << so.max_concurrent_streams
            << " --max_message_bytes=" << so.max_message_bytes << " (0 = no limit of its own)"
            << (so.tls.cert_file.empty() ? "; plaintext" : "; TLS")
            << (so.tls.client_ca_file.empty() ? "" : " with client certificates")
            << (so.auth_token_file.empty() ? "" : "; bearer token required") << std::endl;
  if ((*server)->http_port() > 0) {
    std::cout << "modserve http on " << (so.http_host.empty() ? so.host : so.http_host) << ":"
              << (*server)->http_port() << std::endl;
    std::cout << "modserve http model \"" << (*server)->served_model_name() << "\"" << std::endl;
  }
  if ((*server)->health_port() > 0) {
    std::cout << "modserve health on " << (so.health_host.empty() ? so.host : so.health_host)
              << ":" << (*server)->health_port() << std::endl;
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::cout << "modserve: signal " << signal_number << ", draining (up to "
            << absl::FormatDuration(so.drain_timeout) << ")" << std::endl;
  const bool drained = (*server)->Drain();
  std::cout << "modserve: " << (drained ? "drained" : "drain timeout passed; requests ended")
            << ", exiting" << std::endl;
  server->reset();
  return 0;
}
