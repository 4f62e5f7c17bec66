// modserve: the gRPC server binary. Parses flags into ServerOptions/EngineOptions, starts the
// server, prints the bound ports, and drains on SIGTERM (or SIGINT) before exiting 0.
//
//   modserve --model models/demo --port 50051 --metrics_port 9400
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "server/server.h"

ABSL_FLAG(std::string, model, "", "checkpoint directory (config.json, safetensors, tokenizer)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (0.0.0.0 for every interface)");
ABSL_FLAG(int32_t, port, 50051, "gRPC port; 0 picks a free one (printed on stdout)");
ABSL_FLAG(int32_t, metrics_port, -1, "Prometheus /metrics port; 0 picks one; -1 = off");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads; 0 = every core");
ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda");
ABSL_FLAG(int32_t, max_num_seqs, 16, "sequences in the running batch");
ABSL_FLAG(int32_t, max_batch_tokens, 512, "tokens of one step (decodes plus prefill chunks)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20, "bytes of the paged KV cache");
ABSL_FLAG(int32_t, max_queue, 256, "requests waiting for admission; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "on SIGTERM, how long in-flight requests may run before they are ended");
ABSL_FLAG(uint64_t, seed, 0, "seeds the per-request seeds of requests that set none");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("modserve --model DIR [--port N] [--metrics_port N]");
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
  eo.seed = absl::GetFlag(FLAGS_seed);

  modserve::server::ServerOptions so;
  so.host = absl::GetFlag(FLAGS_host);
  so.port = absl::GetFlag(FLAGS_port);
  so.metrics_port = absl::GetFlag(FLAGS_metrics_port);
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
    std::cout << "modserve metrics on " << so.host << ":" << (*server)->metrics_port() << "/metrics"
              << std::endl;
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
