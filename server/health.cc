// HealthMonitor: a polling thread, so a hung engine thread (no heartbeat) turns health off
// even though nothing calls into the server.
#include "server/health.h"

#include <utility>

namespace modserve::server {

inline constexpr char kServiceName[] = "modserve.v1.ModServe";

bool IsServing(const engine::StepLoop& loop, absl::Time now, absl::Duration stall_limit) {
  return loop.healthy() && !loop.draining() && now - loop.last_heartbeat() < stall_limit;
}

HealthMonitor::HealthMonitor(grpc::HealthCheckServiceInterface* health,
                             const engine::StepLoop* loop, absl::Duration stall_limit,
                             absl::Duration period, std::function<void()> on_tick)
    : health_(health),
      loop_(loop),
      stall_limit_(stall_limit),
      period_(period),
      on_tick_(std::move(on_tick)) {
  Set(IsServing(*loop_, absl::Now(), stall_limit_));
  thread_ = std::thread([this] { Run(); });
}

HealthMonitor::~HealthMonitor() {
  stop_.Notify();
  thread_.join();
}

void HealthMonitor::SetNotServing() { Set(false); }

void HealthMonitor::Set(bool serving) {
  health_->SetServingStatus(serving);
  health_->SetServingStatus(kServiceName, serving);
}

void HealthMonitor::Run() {
  while (!stop_.WaitForNotificationWithTimeout(period_)) {
    Set(IsServing(*loop_, absl::Now(), stall_limit_));
    if (on_tick_) on_tick_();
  }
}

}  // namespace modserve::server
