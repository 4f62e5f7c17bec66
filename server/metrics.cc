// Metrics: families are created once; per-label children are looked up per observation only for
// the bounded labels (finish_reason, code, phase).
#include "server/metrics.h"

#include <chrono>
#include <exception>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/sampler/stop_checker.h"

namespace modserve::server {
namespace {

// From 1 ms: a decode step of a small model on a GPU takes a few ms, so coarser first buckets
// would put every inter-token latency in one bucket.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0};
}

prometheus::Histogram* MakeHistogram(prometheus::Registry& registry, const std::string& name,
                                     const std::string& help) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, LatencyBuckets());
}

prometheus::Counter* MakeCounter(prometheus::Registry& registry, const std::string& name,
                                 const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Gauge* MakeGauge(prometheus::Registry& registry, const std::string& name,
                             const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

double Seconds(absl::Time from, absl::Time to) { return absl::ToDoubleSeconds(to - from); }

}  // namespace

const std::vector<std::string>& MetricNames() {
  static const auto* names = new std::vector<std::string>{
      "modserve_time_to_first_token_seconds",  "modserve_inter_token_latency_seconds",
      "modserve_e2e_request_latency_seconds",  "modserve_request_queue_time_seconds",
      "modserve_request_prefill_time_seconds", "modserve_request_decode_time_seconds",
      "modserve_prompt_tokens_total",          "modserve_generation_tokens_total",
      "modserve_num_requests_running",         "modserve_num_requests_waiting",
      "modserve_kv_cache_usage_ratio",         "modserve_num_preemptions_total",
      "modserve_request_success_total",        "modserve_request_failure_total",
      "modserve_layer_tokens_total",           "modserve_layer_batch_skips_total",
      "modserve_kv_bytes_per_token",           "modserve_kv_bytes_per_token_dense",
      "modserve_step_duration_seconds",        "modserve_prefix_cache_queries_total",
      "modserve_prefix_cache_hits_total",      "modserve_spec_decode_num_drafts_total",
      "modserve_spec_decode_num_draft_tokens_total",
      "modserve_spec_decode_num_accepted_tokens_total",
      "modserve_spec_decode_num_accepted_tokens_per_pos_total",
  };
  return *names;
}

Metrics::Metrics(int32_t n_layers)
    : registry_(std::make_shared<prometheus::Registry>()), n_layers_(n_layers) {
  prometheus::Registry& r = *registry_;
  ttft_ = MakeHistogram(r, "modserve_time_to_first_token_seconds",
                        "Time from acceptance to the first generated token.");
  itl_ = MakeHistogram(r, "modserve_inter_token_latency_seconds",
                       "Time between consecutive tokens of a request.");
  e2e_ = MakeHistogram(r, "modserve_e2e_request_latency_seconds",
                       "Time from acceptance to the end of a successful request.");
  queue_time_ = MakeHistogram(r, "modserve_request_queue_time_seconds",
                              "Time a request waited for admission.");
  prefill_time_ = MakeHistogram(r, "modserve_request_prefill_time_seconds",
                                "Time from admission to the first token.");
  decode_time_ = MakeHistogram(r, "modserve_request_decode_time_seconds",
                               "Time from the first token to the end of the request.");
  // prometheus-cpp appends nothing to counter names, so the _total suffix is part of the name.
  prompt_tokens_ = MakeCounter(r, "modserve_prompt_tokens_total", "Prompt tokens admitted.");
  generation_tokens_ = MakeCounter(r, "modserve_generation_tokens_total", "Tokens generated.");
  prefix_queries_ = MakeCounter(r, "modserve_prefix_cache_queries_total",
                                "Prompt tokens looked up in the prefix cache.");
  prefix_hits_ = MakeCounter(r, "modserve_prefix_cache_hits_total",
                             "Prompt tokens found in the prefix cache (KV entries reused).");
  spec_drafts_ = MakeCounter(r, "modserve_spec_decode_num_drafts_total",
                             "Speculative decode steps of a sequence (one draft each).");
  spec_draft_tokens_ = MakeCounter(r, "modserve_spec_decode_num_draft_tokens_total",
                                   "Tokens drafted by speculative decoding.");
  spec_accepted_tokens_ = MakeCounter(r, "modserve_spec_decode_num_accepted_tokens_total",
                                      "Drafted tokens that verification accepted.");
  spec_accepted_per_pos_ = &prometheus::BuildCounter()
                                .Name("modserve_spec_decode_num_accepted_tokens_per_pos_total")
                                .Help("Accepted drafts by position in the draft (0-based).")
                                .Register(r);
  for (int32_t pos = 0; pos < engine::kMaxSpeculativeTokens; ++pos) {
    spec_accepted_per_pos_->Add({{"position", std::to_string(pos)}});
  }
  running_ = MakeGauge(r, "modserve_num_requests_running", "Requests in the running batch.");
  waiting_ = MakeGauge(r, "modserve_num_requests_waiting", "Requests waiting for admission.");
  kv_usage_ = MakeGauge(r, "modserve_kv_cache_usage_ratio", "Fraction of KV pages in use.");
  preemptions_ = MakeCounter(r, "modserve_num_preemptions_total",
                             "Sequences preempted (recomputed later) for lack of KV pages.");
  success_ = &prometheus::BuildCounter()
                  .Name("modserve_request_success_total")
                  .Help("Requests that finished, by finish_reason.")
                  .Register(r);
  for (auto reason : {engine::FinishReason::kLength, engine::FinishReason::kStopToken,
                      engine::FinishReason::kStopString}) {
    success_->Add({{"finish_reason", std::string(engine::FinishReasonName(reason))}});
  }
  failure_ = &prometheus::BuildCounter()
                  .Name("modserve_request_failure_total")
                  .Help("Requests that ended with an error, by gRPC status code.")
                  .Register(r);
  // Zero-valued series for the codes the server produces, so rate() works before the first one.
  for (absl::StatusCode code : {absl::StatusCode::kInvalidArgument, absl::StatusCode::kOutOfRange,
                                absl::StatusCode::kResourceExhausted,
                                absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
                                absl::StatusCode::kCancelled, absl::StatusCode::kInternal}) {
    failure_->Add({{"code", absl::StatusCodeToString(code)}});
  }
  auto& layer_tokens = prometheus::BuildCounter()
                           .Name("modserve_layer_tokens_total")
                           .Help("Tokens per layer that were computed or skipped (MoD routing).")
                           .Register(r);
  auto& batch_skips = prometheus::BuildCounter()
                          .Name("modserve_layer_batch_skips_total")
                          .Help("Steps in which no token of the batch entered the layer.")
                          .Register(r);
  for (int32_t l = 0; l < n_layers; ++l) {
    const std::string layer = std::to_string(l);
    layer_computed_.push_back(&layer_tokens.Add({{"layer", layer}, {"decision", "computed"}}));
    layer_skipped_.push_back(&layer_tokens.Add({{"layer", layer}, {"decision", "skipped"}}));
    layer_batch_skips_.push_back(&batch_skips.Add({{"layer", layer}}));
  }
  kv_bytes_per_token_ = MakeGauge(r, "modserve_kv_bytes_per_token",
                                  "KV bytes a token holds, from the measured routed fractions.");
  kv_bytes_per_token_dense_ = MakeGauge(r, "modserve_kv_bytes_per_token_dense",
                                        "KV bytes a token would hold if every layer stored it.");
  auto& step_duration = prometheus::BuildHistogram()
                            .Name("modserve_step_duration_seconds")
                            .Help("Duration of one engine step, by phase (prefill, decode, mixed).")
                            .Register(r);
  step_prefill_ = &step_duration.Add({{"phase", "prefill"}}, LatencyBuckets());
  step_decode_ = &step_duration.Add({{"phase", "decode"}}, LatencyBuckets());
  step_mixed_ = &step_duration.Add({{"phase", "mixed"}}, LatencyBuckets());
}

Metrics::~Metrics() = default;

absl::Status Metrics::Serve(const std::string& host, int port) {
  // civetweb occasionally fails to start its listener under load (seen with port 0 while other
  // servers start on the same machine); a few tries at start-up cost nothing.
  constexpr int kAttempts = 5;
  std::string error;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(absl::StrCat(host, ":", port));
      exposer_->RegisterCollectable(registry_);
      const std::vector<int> ports = exposer_->GetListeningPorts();
      port_ = ports.empty() ? 0 : ports.front();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      exposer_.reset();
      error = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", host, ":", port,
                                             " after ", kAttempts, " attempts: ", error));
}

void Metrics::Refresh(const engine::StepLoop& loop) {
  running_->Set(loop.num_running());
  waiting_->Set(loop.num_waiting());
  kv_usage_->Set(loop.kv_num_pages() > 0
                     ? static_cast<double>(loop.kv_used_pages()) / loop.kv_num_pages()
                     : 0.0);
}

void Metrics::CountFailure(absl::StatusCode code) {
  failure_->Add({{"code", absl::StatusCodeToString(code)}}).Increment();
}

void Metrics::OnStep(const engine::StepStats& stats) {
  prometheus::Histogram* step = stats.phase == "prefill"  ? step_prefill_
                                : stats.phase == "decode" ? step_decode_
                                                          : step_mixed_;
  step->Observe(absl::ToDoubleSeconds(stats.duration));
  prompt_tokens_->Increment(stats.num_prompt_tokens);
  generation_tokens_->Increment(stats.num_sampled);
  prefix_queries_->Increment(static_cast<double>(stats.prefix_cache_queries));
  prefix_hits_->Increment(static_cast<double>(stats.prefix_cache_hits));
  spec_drafts_->Increment(static_cast<double>(stats.spec_num_drafts));
  spec_draft_tokens_->Increment(static_cast<double>(stats.spec_num_draft_tokens));
  spec_accepted_tokens_->Increment(static_cast<double>(stats.spec_num_accepted_tokens));
  for (size_t pos = 0; pos < stats.spec_accepted_per_position.size(); ++pos) {
    if (stats.spec_accepted_per_position[pos] == 0) continue;
    spec_accepted_per_pos_->Add({{"position", std::to_string(pos)}})
        .Increment(static_cast<double>(stats.spec_accepted_per_position[pos]));
  }
  for (double s : stats.inter_token_seconds) itl_->Observe(s);
  for (int32_t l = 0; l < n_layers_ && l < static_cast<int32_t>(stats.layer_computed.size()); ++l) {
    layer_computed_[l]->Increment(stats.layer_computed[l]);
    layer_skipped_[l]->Increment(stats.layer_skipped[l]);
    if (stats.num_tokens > 0 && stats.layer_computed[l] == 0) layer_batch_skips_[l]->Increment();
  }
  running_->Set(stats.num_running);
  waiting_->Set(stats.num_waiting);
  kv_usage_->Set(stats.kv_usage_ratio);
  kv_bytes_per_token_->Set(stats.kv_bytes_per_token);
  kv_bytes_per_token_dense_->Set(stats.kv_bytes_per_token_dense);
}

void Metrics::OnPreemption() { preemptions_->Increment(); }

void Metrics::OnRequestFinished(const engine::FinishedRequest& request) {
  const engine::RequestTimings& t = request.timings;
  success_
      ->Add(
          {{"finish_reason", std::string(engine::FinishReasonName(request.result.finish_reason))}})
      .Increment();
  e2e_->Observe(Seconds(t.accepted, t.finished));
  queue_time_->Observe(Seconds(t.accepted, t.scheduled));
  ttft_->Observe(Seconds(t.accepted, t.first_token));
  prefill_time_->Observe(Seconds(t.scheduled, t.first_token));
  decode_time_->Observe(Seconds(t.first_token, t.finished));
}

void Metrics::OnRequestFailed(absl::StatusCode code) { CountFailure(code); }

}  // namespace modserve::server
