// EngineGate: holds the engine thread at the top of its loop while closed, through the
// StepLoopOptions::before_iteration test hook. Shared by the in-process server tests.
#ifndef MODSERVE_TESTS_SERVER_ENGINE_GATE_H_
#define MODSERVE_TESTS_SERVER_ENGINE_GATE_H_

#include <cstdint>

#include "absl/synchronization/mutex.h"

namespace modserve::server::testing {

// Thread contract: Pass runs on the engine thread; the others on the test's thread.
class EngineGate {
 public:
  // The hook: waits while the gate is closed and no single iteration has been let through.
  void Pass() {
    absl::MutexLock lock(&mu_);
    ++arrivals_;
    auto may_pass = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !closed_ || permits_ > 0; };
    mu_.Await(absl::Condition(&may_pass));
    if (closed_) --permits_;
  }
  // Closes the gate; the engine thread stops at its next iteration.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Closes the gate and returns once the engine thread waits at it.
  void CloseAndWait() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    const int64_t seen = arrivals_;
    auto arrived = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return arrivals_ > seen; };
    mu_.Await(absl::Condition(&arrived));
  }
  // Lets exactly one iteration through the closed gate and returns once the engine thread waits
  // at it again. Call only while the engine thread waits at the gate (after CloseAndWait).
  void StepOnce() {
    absl::MutexLock lock(&mu_);
    const int64_t seen = arrivals_;
    ++permits_;
    auto arrived = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return arrivals_ > seen; };
    mu_.Await(absl::Condition(&arrived));
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    closed_ = false;
    permits_ = 0;
  }

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t permits_ ABSL_GUARDED_BY(mu_) = 0;  // iterations let through while closed
};

}  // namespace modserve::server::testing

#endif  // MODSERVE_TESTS_SERVER_ENGINE_GATE_H_
