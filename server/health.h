// Keeps grpc.health.v1 in step with the engine: SERVING only while the engine thread makes
// progress and is neither draining nor failed. It polls; it never touches the engine itself.
#ifndef MODSERVE_SERVER_HEALTH_H_
#define MODSERVE_SERVER_HEALTH_H_

#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/executor/step_loop.h"
#include "grpcpp/health_check_service_interface.h"

namespace modserve::server {

// SERVING iff the loop is healthy, not draining, and its heartbeat is younger than stall_limit.
bool IsServing(const engine::StepLoop& loop, absl::Time now, absl::Duration stall_limit);

// Owns a thread that re-evaluates IsServing every `period` and sets the status of the overall
// server ("") and of the ModServe service; `on_tick` (may be empty) runs on the same thread.
// `health` and `loop` must outlive the monitor. Destruction stops the thread.
class HealthMonitor {
 public:
  HealthMonitor(grpc::HealthCheckServiceInterface* health, const engine::StepLoop* loop,
                absl::Duration stall_limit, absl::Duration period, std::function<void()> on_tick);
  ~HealthMonitor();

  // Sets NOT_SERVING now (a drain started) without waiting for the next tick.
  void SetNotServing();

 private:
  void Run();
  void Set(bool serving);

  grpc::HealthCheckServiceInterface* health_;
  const engine::StepLoop* loop_;
  absl::Duration stall_limit_;
  absl::Duration period_;
  std::function<void()> on_tick_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_HEALTH_H_
