// modserve-loadgen: N concurrent streams against one modserve server or several replicas, prompts
// from a file; prints time to first token and inter-token latency percentiles, tokens/s, errors
// by code, retries and requests per replica. It measures from the client side (network included)
// and does no warm-up of its own.
//
//   modserve-loadgen --server 127.0.0.1:50051 --prompts prompts.txt --concurrency 8
//       --num_requests 64 --max_new_tokens 128
//   modserve-loadgen --server 127.0.0.1:5001,127.0.0.1:5002 --lb_policy round_robin --retries 3
//   modserve-loadgen --http 127.0.0.1:8000 --prompts prompts.txt   (the OpenAI HTTP API)
// Prompt file: one prompt per line; a line "ids:1,2,3" sends token ids instead of text.
// --server is any gRPC target: host:port, a comma-separated list of IPv4 host:port (taken as the
// `ipv4:` scheme), or a URI such as dns:///modserve.ns.svc.cluster.local:50051 (a headless
// Service: every ready pod). --retries resends a whole request that ended UNAVAILABLE (a replica
// died or drains), also after tokens arrived; gRPC's own retry policy stops at the first message.
// Streams are read with gRPC's callback API: each message is timed on the gRPC thread it lands
// on, with no loadgen thread woken per token, so the client takes little CPU from a server on the
// same machine. With --offline_model DIR it first runs the same requests through the engine
// in-process (Engine::Generate, batches of --concurrency) and prints the served/offline tokens/s
// ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "grpcpp/grpcpp.h"
#include "clients/loadgen/http_driver.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tools/cli_usage.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "gRPC target: host:port, IPv4 host:port,host:port,... (several replicas), or a URI "
          "(ipv4:, ipv6:, dns:///name:port)");
ABSL_FLAG(std::string, lb_policy, "pick_first",
          "how the channel spreads requests over the target's addresses: pick_first (all to one) "
          "or round_robin (per request, over every ready address)");
ABSL_FLAG(int32_t, retries, 0,
          "resend a request that ended UNAVAILABLE (replica gone or draining) up to N times, "
          "the whole request again, even after tokens arrived");
ABSL_FLAG(absl::Duration, retry_backoff, absl::Milliseconds(50),
          "pause before the first resend; doubles per resend of the same request, at most 2s");
ABSL_FLAG(std::string, http, "",
          "HOST:PORT of an OpenAI-compatible HTTP API (modserve --http_port): stream the same "
          "requests from its /v1/completions instead of gRPC (--server, --lb_policy and --retries "
          "are then unused)");
ABSL_FLAG(std::string, prompts, "", "file with one prompt per line ('ids:1,2,3' for token ids)");
ABSL_FLAG(int32_t, concurrency, 8, "streams in flight at once");
ABSL_FLAG(int32_t, num_requests, 64, "requests in total");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(),
          "if set, keep sending requests until this much time has passed (instead of "
          "--num_requests)");
ABSL_FLAG(int32_t, max_new_tokens, 128, "tokens per request");
ABSL_FLAG(bool, ignore_eos, true, "generate exactly max_new_tokens");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(int64_t, seed, -1,
          "sampling seed of every request; -1 = none (the server draws one, so a resent sampled "
          "request may give other tokens)");
ABSL_FLAG(std::string, offline_model, "",
          "also run the requests offline on this checkpoint and compare tokens/s");
ABSL_FLAG(int32_t, offline_threads, 0, "CPU threads of the offline engine; 0 = every core");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(600), "deadline of each attempt of a request");
ABSL_FLAG(std::string, json_out, "", "also write the results as a JSON object to this file");

namespace {

namespace v1 = modserve::v1;

// Attempts that ended on one replica (ClientContext::peer(), e.g. "ipv4:127.0.0.1:5001").
struct PeerCounts {
  int ok = 0;
  int failed = 0;
};

struct Results {
  std::vector<double> ttft;           // seconds, one per successful request
  std::vector<double> itl;            // seconds, one per token after the first
  int64_t tokens = 0;                 // every token received, failed attempts included
  int64_t discarded_tokens = 0;       // tokens of attempts that failed and were resent
  int retries = 0;                    // resends
  std::map<std::string, int> errors;  // requests that failed for good, by gRPC code name
  std::map<std::string, PeerCounts> peers;
};

std::string CodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int c = static_cast<int>(code);
  return c >= 0 && c < 17 ? kNames[c] : std::to_string(c);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t idx = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()));
  return v[idx];
}

// A comma-separated list without a scheme ("10.0.0.1:5001,10.0.0.2:5001") is what gRPC's ipv4:
// resolver takes; the default dns: resolver would read it as one host name.
std::string NormalizeTarget(const std::string& target) {
  if (!absl::StrContains(target, ',')) return target;
  for (const char* scheme : {"ipv4:", "ipv6:", "dns:", "unix:", "unix-abstract:"}) {
    if (absl::StartsWith(target, scheme)) return target;
  }
  return "ipv4:" + target;
}

// UNAVAILABLE is what a replica that died (connection reset), drains (SIGTERM) or cannot be
// reached gives. Everything else (RESOURCE_EXHAUSTED from a full queue included) is the answer.
bool Retryable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE;
}

// One request across its attempts: resent whole (greedy or seeded requests give the same tokens
// again) while it ends UNAVAILABLE and --retries allows. Owned by the attempt in flight, or by
// the driver's retry queue while it backs off.
struct Pending {
  v1::GenerateRequest req;
  absl::Time start;  // of the first attempt: TTFT is what its caller waited
  int32_t attempt = 0;
  absl::Duration backoff;  // before the next resend
};

// What one attempt saw, handed from its reactor to the driver once the stream has ended.
struct AttemptOutcome {
  std::unique_ptr<Pending> pending;
  grpc::Status status;
  std::string peer;
  double ttft = 0.0;
  std::vector<double> itl;
  int64_t tokens = 0;
};

class StreamAttempt;

// Keeps --concurrency requests in flight over the callback API. Each of the `concurrency` slots
// is a chain of requests: when one ends for good, the reaction that saw it end starts the next
// (no hand-off to another thread); a slot retires once --num_requests or --duration is used up.
// Resends wait out their backoff in a queue that Run()'s thread (the caller's) drains, so no gRPC
// thread ever sleeps; the slot stays taken meanwhile, as a blocking worker's would.
// Thread-safe; the stub and prompts must outlive Run().
class LoadDriver {
 public:
  LoadDriver(v1::ModServe::Stub* stub, const std::vector<v1::GenerateRequest>* prompts)
      : stub_(stub),
        prompts_(prompts),
        concurrency_(absl::GetFlag(FLAGS_concurrency)),
        total_(absl::GetFlag(FLAGS_num_requests)),
        duration_(absl::GetFlag(FLAGS_duration)),
        max_retries_(absl::GetFlag(FLAGS_retries)),
        first_backoff_(absl::GetFlag(FLAGS_retry_backoff)),
        timeout_(absl::GetFlag(FLAGS_timeout)),
        max_new_tokens_(absl::GetFlag(FLAGS_max_new_tokens)) {}

  // Starts the slots, runs resends as they fall due, and returns once every slot retired.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  // Valid after Run() returned.
  const Results& results() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return results_; }
  int32_t issued() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return issued_; }
  absl::Time start() const { return start_; }

  // Called by a StreamAttempt after it deleted itself; may start the next request.
  void AttemptDone(AttemptOutcome outcome) ABSL_LOCKS_EXCLUDED(mu_);

  v1::ModServe::Stub* stub() const { return stub_; }
  absl::Duration timeout() const { return timeout_; }
  int32_t max_new_tokens() const { return max_new_tokens_; }

 private:
  // Takes the next request index for a slot and starts it, or retires the slot.
  void StartNextOrRetire() ABSL_LOCKS_EXCLUDED(mu_);
  void Launch(std::unique_ptr<Pending> pending);

  v1::ModServe::Stub* const stub_;
  const std::vector<v1::GenerateRequest>* const prompts_;
  const int32_t concurrency_;
  const int32_t total_;
  const absl::Duration duration_;
  const int32_t max_retries_;
  const absl::Duration first_backoff_;
  const absl::Duration timeout_;
  const int32_t max_new_tokens_;
  absl::Time start_;

  // Held once per attempt (never per token), for a few microseconds.
  absl::Mutex mu_;
  int32_t next_ ABSL_GUARDED_BY(mu_) = 0;          // next request index to take
  int32_t issued_ ABSL_GUARDED_BY(mu_) = 0;        // requests started
  int32_t active_slots_ ABSL_GUARDED_BY(mu_) = 0;  // slots not yet retired
  // Resends by due time; at most one per slot.
  std::multimap<absl::Time, std::unique_ptr<Pending>> retry_queue_ ABSL_GUARDED_BY(mu_);
  uint64_t retries_queued_ ABSL_GUARDED_BY(mu_) = 0;  // wakes Run() for an earlier due time
  Results results_ ABSL_GUARDED_BY(mu_);
};

// One attempt of one request: a server stream read on gRPC's callback threads. It times every
// message as it lands and keeps the numbers to itself until OnDone, so a token costs no lock and
// no thread switch. Deletes itself in OnDone.
class StreamAttempt final : public grpc::ClientReadReactor<v1::GenerateStreamResponse> {
 public:
  StreamAttempt(LoadDriver* driver, std::unique_ptr<Pending> pending)
      : driver_(driver), pending_(std::move(pending)) {
    // Sized for the usual run so OnReadDone does not reallocate; capped for huge limits.
    itl_.reserve(static_cast<size_t>(std::clamp(driver_->max_new_tokens(), 0, 4096)));
  }

  void Start() {
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      absl::ToChronoNanoseconds(driver_->timeout()));
    driver_->stub()->async()->GenerateStream(&ctx_, &pending_->req, this);
    StartRead(&msg_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows with its status
    const int n = msg_.token_ids_size();
    if (n > 0) {
      const absl::Time now = absl::Now();
      if (first_) {
        ttft_ = absl::ToDoubleSeconds(now - pending_->start);
        first_ = false;
        // Tokens that arrived together with the first share its arrival: zero gaps.
        for (int i = 1; i < n; ++i) itl_.push_back(0.0);
      } else {
        // Several tokens in one message (the server coalesces for slow readers): split the gap.
        const double gap = absl::ToDoubleSeconds(now - last_) / n;
        for (int i = 0; i < n; ++i) itl_.push_back(gap);
      }
      last_ = now;
      tokens_ += n;
    }
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& status) override {
    AttemptOutcome outcome;
    outcome.pending = std::move(pending_);
    outcome.status = status;
    outcome.peer = ctx_.peer();
    if (outcome.peer.empty()) outcome.peer = "(no connection)";
    outcome.ttft = ttft_;
    outcome.itl = std::move(itl_);
    outcome.tokens = tokens_;
    LoadDriver* driver = driver_;
    // Gone before the driver hears of it, so once the last slot retires no reactor is left.
    delete this;
    driver->AttemptDone(std::move(outcome));
  }

 private:
  LoadDriver* const driver_;
  std::unique_ptr<Pending> pending_;
  grpc::ClientContext ctx_;
  v1::GenerateStreamResponse msg_;
  bool first_ = true;
  absl::Time last_;
  double ttft_ = 0.0;
  std::vector<double> itl_;
  int64_t tokens_ = 0;
};

void LoadDriver::Launch(std::unique_ptr<Pending> pending) {
  (new StreamAttempt(this, std::move(pending)))->Start();
}

void LoadDriver::StartNextOrRetire() {
  int32_t idx;
  {
    absl::MutexLock lock(&mu_);
    idx = next_++;
    // With --duration a slot stops taking requests once it has passed; else after `total`.
    const bool more =
        duration_ > absl::ZeroDuration() ? absl::Now() - start_ < duration_ : idx < total_;
    if (!more) {
      --active_slots_;
      return;
    }
    ++issued_;
  }
  auto pending = std::make_unique<Pending>();
  pending->req = (*prompts_)[static_cast<size_t>(idx) % prompts_->size()];
  pending->req.set_request_id("loadgen-" + std::to_string(idx));
  pending->start = absl::Now();
  pending->backoff = first_backoff_;
  Launch(std::move(pending));
}

void LoadDriver::AttemptDone(AttemptOutcome outcome) {
  const grpc::Status& status = outcome.status;
  const bool retry = !status.ok() && Retryable(status) && outcome.pending->attempt < max_retries_;
  {
    absl::MutexLock lock(&mu_);
    results_.tokens += outcome.tokens;
    if (status.ok()) {
      ++results_.peers[outcome.peer].ok;
      results_.ttft.push_back(outcome.ttft);
      results_.itl.insert(results_.itl.end(), outcome.itl.begin(), outcome.itl.end());
    } else {
      ++results_.peers[outcome.peer].failed;
      if (!retry) {
        ++results_.errors[CodeName(status.error_code())];
      } else {
        ++results_.retries;
        results_.discarded_tokens += outcome.tokens;
        Pending& p = *outcome.pending;
        const absl::Time due = absl::Now() + p.backoff;
        ++p.attempt;
        p.backoff = std::min(2 * p.backoff, absl::Seconds(2));
        retry_queue_.emplace(due, std::move(outcome.pending));
        ++retries_queued_;
        return;
      }
    }
  }
  StartNextOrRetire();
}

void LoadDriver::Run() {
  start_ = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    active_slots_ = std::max(concurrency_, 0);
  }
  for (int32_t w = 0; w < concurrency_; ++w) StartNextOrRetire();
  mu_.Lock();
  while (active_slots_ > 0) {
    if (retry_queue_.empty()) {
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return active_slots_ == 0 || !retry_queue_.empty();
      };
      mu_.Await(absl::Condition(&woken));
      continue;
    }
    auto first = retry_queue_.begin();
    if (absl::Now() < first->first) {
      const uint64_t seen = retries_queued_;
      auto woken = [this, seen]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return retries_queued_ != seen; };
      mu_.AwaitWithDeadline(absl::Condition(&woken), first->first);
      continue;
    }
    std::unique_ptr<Pending> pending = std::move(first->second);
    retry_queue_.erase(first);
    mu_.Unlock();
    Launch(std::move(pending));
    mu_.Lock();
  }
  mu_.Unlock();
}

// Tokens/s of Engine::Generate over the requests in batches of `concurrency` (what the server
// could reach at best with the same batch), or a negative value after printing an error.
double OfflineTokensPerSecond(const std::vector<v1::GenerateRequest>& requests, int32_t total,
                              int32_t concurrency) {
  namespace engine = modserve::engine;
  engine::EngineOptions eo;
  eo.model_dir = absl::GetFlag(FLAGS_offline_model);
  eo.num_threads = absl::GetFlag(FLAGS_offline_threads);
  eo.max_seqs = concurrency;
  auto e = engine::Engine::Create(eo);
  if (!e.ok()) {
    std::cerr << "modserve-loadgen: offline engine: " << e.status() << std::endl;
    return -1.0;
  }
  std::vector<engine::Request> batch;
  int64_t tokens = 0;
  const absl::Time start = absl::Now();
  for (int32_t i = 0; i < total; ++i) {
    const v1::GenerateRequest& r = requests[static_cast<size_t>(i) % requests.size()];
    engine::Request er;
    if (r.has_prompt_token_ids()) {
      er.prompt.assign(r.prompt_token_ids().ids().begin(), r.prompt_token_ids().ids().end());
    } else if ((*e)->tokenizer() != nullptr) {
      auto ids = (*e)->tokenizer()->Encode(r.prompt(), /*add_special_tokens=*/true);
      if (!ids.ok()) {
        std::cerr << "modserve-loadgen: offline tokenize: " << ids.status() << std::endl;
        return -1.0;
      }
      er.prompt = *std::move(ids);
    } else {
      std::cerr << "modserve-loadgen: text prompts need a tokenizer offline" << std::endl;
      return -1.0;
    }
    er.sampling.temperature = r.sampling().temperature();
    er.sampling.max_new_tokens = r.stopping().max_new_tokens();
    er.sampling.ignore_eos = r.stopping().ignore_eos();
    batch.push_back(std::move(er));
    if (static_cast<int32_t>(batch.size()) == concurrency || i + 1 == total) {
      auto results = (*e)->Generate(batch);
      if (!results.ok()) {
        std::cerr << "modserve-loadgen: offline generate: " << results.status() << std::endl;
        return -1.0;
      }
      for (const auto& res : *results) tokens += static_cast<int64_t>(res.token_ids.size());
      batch.clear();
    }
  }
  return tokens / absl::ToDoubleSeconds(absl::Now() - start);
}

nlohmann::json LatencyJson(const std::vector<double>& v) {
  return {{"p50", Percentile(v, 50)},
          {"p90", Percentile(v, 90)},
          {"p99", Percentile(v, 99)},
          {"max", v.empty() ? 0.0 : *std::max_element(v.begin(), v.end())}};
}

bool WriteJson(const std::string& path, const Results& results, int32_t issued, double wall,
               double offline) {
  nlohmann::json peers = nlohmann::json::object();
  for (const auto& [peer, counts] : results.peers) {
    peers[peer] = {{"ok", counts.ok}, {"failed", counts.failed}};
  }
  nlohmann::json j = {{"requests_ok", static_cast<int>(results.ttft.size())},
                      {"requests_total", issued},
                      {"concurrency", absl::GetFlag(FLAGS_concurrency)},
                      {"wall_seconds", wall},
                      {"tokens", results.tokens},
                      {"tokens_per_second", results.tokens / wall},
                      {"ttft_seconds", LatencyJson(results.ttft)},
                      {"itl_seconds", LatencyJson(results.itl)},
                      {"errors", results.errors},
                      {"retries", results.retries},
                      {"discarded_tokens", results.discarded_tokens},
                      {"peers", peers}};
  if (offline > 0.0) j["offline_tokens_per_second"] = offline;
  std::ofstream out(path);
  // Replace, not throw, on invalid UTF-8 (peer strings come from the network stack).
  out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  modserve::cli::SetUsage("modserve-loadgen --prompts FILE [--concurrency N] ...", __FILE__);
  absl::ParseCommandLine(argc, argv);
  const std::string lb_policy = absl::GetFlag(FLAGS_lb_policy);
  if (lb_policy != "pick_first" && lb_policy != "round_robin") {
    std::cerr << "modserve-loadgen: --lb_policy '" << lb_policy
              << "' is not pick_first or round_robin" << std::endl;
    return 1;
  }
  if (absl::GetFlag(FLAGS_retries) < 0) {
    std::cerr << "modserve-loadgen: --retries " << absl::GetFlag(FLAGS_retries) << " is negative"
              << std::endl;
    return 1;
  }
  std::ifstream in(absl::GetFlag(FLAGS_prompts));
  if (!in) {
    std::cerr << "modserve-loadgen: cannot read --prompts '" << absl::GetFlag(FLAGS_prompts) << "'"
              << std::endl;
    return 1;
  }
  std::vector<v1::GenerateRequest> requests;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    v1::GenerateRequest req;
    if (absl::StartsWith(line, "ids:")) {
      for (absl::string_view part : absl::StrSplit(line.substr(4), ',', absl::SkipWhitespace())) {
        int32_t id;
        if (!absl::SimpleAtoi(part, &id)) {
          std::cerr << "modserve-loadgen: bad token id '" << part << "'" << std::endl;
          return 1;
        }
        req.mutable_prompt_token_ids()->add_ids(id);
      }
    } else {
      req.set_prompt(line);
    }
    req.mutable_stopping()->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
    req.mutable_stopping()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
    req.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
    if (absl::GetFlag(FLAGS_seed) >= 0) {
      req.mutable_sampling()->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
    }
    requests.push_back(req);
  }
  if (requests.empty()) {
    std::cerr << "modserve-loadgen: no prompts in the file" << std::endl;
    return 1;
  }
  const int32_t total = absl::GetFlag(FLAGS_num_requests);
  double offline = 0.0;
  if (!absl::GetFlag(FLAGS_offline_model).empty()) {
    offline = OfflineTokensPerSecond(requests, total, absl::GetFlag(FLAGS_concurrency));
    if (offline < 0.0) return 1;
  }
  Results results;
  int32_t issued = 0;
  double wall = 0.0;
  if (!absl::GetFlag(FLAGS_http).empty()) {
    // The same requests as OpenAI completions bodies.
    std::vector<std::string> bodies;
    for (const v1::GenerateRequest& r : requests) {
      nlohmann::json body = {{"max_tokens", r.stopping().max_new_tokens()},
                             {"temperature", r.sampling().temperature()},
                             {"ignore_eos", r.stopping().ignore_eos()},
                             {"stream", true}};
      if (r.has_prompt_token_ids()) {
        body["prompt"] = std::vector<int32_t>(r.prompt_token_ids().ids().begin(),
                                              r.prompt_token_ids().ids().end());
      } else {
        body["prompt"] = r.prompt();
      }
      if (r.sampling().has_seed()) body["seed"] = r.sampling().seed();
      bodies.push_back(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
    modserve::loadgen::HttpLoadResult h = modserve::loadgen::RunHttpLoad(
        absl::GetFlag(FLAGS_http), bodies, absl::GetFlag(FLAGS_concurrency), total,
        absl::GetFlag(FLAGS_timeout));
    results.ttft = std::move(h.ttft);
    results.itl = std::move(h.itl);
    results.tokens = h.tokens;
    results.errors = std::move(h.errors);
    issued = h.issued;
    wall = h.wall_seconds;
  } else {
    grpc::ChannelArguments args;
    args.SetLoadBalancingPolicyName(lb_policy);
    auto stub = v1::ModServe::NewStub(grpc::CreateCustomChannel(
        NormalizeTarget(absl::GetFlag(FLAGS_server)), grpc::InsecureChannelCredentials(), args));
    LoadDriver driver(stub.get(), &requests);
    driver.Run();
    wall = absl::ToDoubleSeconds(absl::Now() - driver.start());
    results = driver.results();
    issued = driver.issued();
  }

  std::printf("requests: %d ok, %d total, concurrency %d, %.2f s\n",
              static_cast<int>(results.ttft.size()), issued, absl::GetFlag(FLAGS_concurrency),
              wall);
  std::printf("tokens/s: %.1f (%lld tokens)\n", results.tokens / wall,
              static_cast<long long>(results.tokens));
  if (offline > 0.0) {
    std::printf("offline tokens/s: %.1f (Engine::Generate, batch %d); served/offline: %.1f%%\n",
                offline, absl::GetFlag(FLAGS_concurrency), 100.0 * results.tokens / wall / offline);
  }
  std::printf("ttft ms: p50 %.2f  p90 %.2f  p99 %.2f\n", 1e3 * Percentile(results.ttft, 50),
              1e3 * Percentile(results.ttft, 90), 1e3 * Percentile(results.ttft, 99));
  std::printf("itl ms:  p50 %.3f  p90 %.3f  p99 %.3f\n", 1e3 * Percentile(results.itl, 50),
              1e3 * Percentile(results.itl, 90), 1e3 * Percentile(results.itl, 99));
  std::printf("errors:");
  if (results.errors.empty()) std::printf(" none");
  for (const auto& [code, n] : results.errors) std::printf(" %s=%d", code.c_str(), n);
  std::printf("\n");
  std::printf("retries: %d (%lld tokens of failed attempts discarded)\n", results.retries,
              static_cast<long long>(results.discarded_tokens));
  for (const auto& [peer, counts] : results.peers) {
    std::printf("replica %s: %d ok, %d failed attempts\n", peer.c_str(), counts.ok, counts.failed);
  }
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty() && !WriteJson(json_out, results, issued, wall, offline)) {
    std::cerr << "modserve-loadgen: cannot write --json_out '" << json_out << "'" << std::endl;
    return 1;
  }
  return results.errors.empty() ? 0 : 1;
}
