// Prometheus metrics of the server (names aligned with vLLM's under the modserve_ prefix, plus
// the MoD ones) and the /metrics HTTP endpoint. It maps engine-side observations
// (engine::StepObserver) to prometheus; the engine never sees a prometheus type.
#ifndef MODSERVE_SERVER_METRICS_H_
#define MODSERVE_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/executor/step_loop.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace modserve::server {

// Every metric name, for documentation and the end-to-end test.
const std::vector<std::string>& MetricNames();

// Thread contract: every method is safe from any thread (prometheus metrics are atomic);
// the StepObserver methods run on the engine thread and never block.
class Metrics final : public engine::StepObserver {
 public:
  explicit Metrics(int32_t n_layers);
  ~Metrics() override;

  // Serves /metrics on host:port (port 0 picks one). Unavailable when the port cannot be bound.
  absl::Status Serve(const std::string& host, int port);
  // The bound port, or 0 when not serving.
  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

  // Gauges from the loop's published counters (called on a timer, since idle loops run no step).
  void Refresh(const engine::StepLoop& loop);
  // A request refused before it reached the engine (validation, queue full, draining).
  void CountFailure(absl::StatusCode code);

  void OnStep(const engine::StepStats& stats) override;
  void OnPreemption() override;
  void OnRequestFinished(const engine::FinishedRequest& request) override;
  void OnRequestFailed(absl::StatusCode code) override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  int32_t n_layers_;

  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* prefill_time_;
  prometheus::Histogram* decode_time_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* spec_drafts_;
  prometheus::Counter* spec_draft_tokens_;
  prometheus::Counter* spec_accepted_tokens_;
  prometheus::Family<prometheus::Counter>* spec_accepted_per_pos_;  // label: position
  prometheus::Counter* generation_tokens_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Counter* preemptions_;
  prometheus::Family<prometheus::Counter>* success_;
  prometheus::Family<prometheus::Counter>* failure_;
  std::vector<prometheus::Counter*> layer_computed_;     // [n_layers]
  std::vector<prometheus::Counter*> layer_skipped_;      // [n_layers]
  std::vector<prometheus::Counter*> layer_batch_skips_;  // [n_layers]
  prometheus::Gauge* kv_bytes_per_token_;
  prometheus::Gauge* kv_bytes_per_token_dense_;
  // modserve_step_duration_seconds by phase, made once: Family::Add per step would build a label
  // map and take the family's lock on the engine thread.
  prometheus::Histogram* step_prefill_;
  prometheus::Histogram* step_decode_;
  prometheus::Histogram* step_mixed_;
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_METRICS_H_
