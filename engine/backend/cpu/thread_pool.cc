// Worker threads and the publish/claim/complete handshake of ThreadPool::Run.
#include "engine/backend/cpu/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace modserve::backend::cpu {
namespace {

thread_local bool tls_in_parallel_region = false;

// Consecutive ops of one forward pass follow each other within microseconds, so a worker spins
// this long for the next one before it sleeps. The bound is in time, not in pause instructions:
// a pause costs ~10 cycles on some cores and ~140 on others. Longer gaps (sampling, scheduling
// between steps) put the workers to sleep, which leaves the cores to the gRPC threads.
constexpr auto kWorkerSpin = std::chrono::microseconds(30);
// The caller waits only for chunks already claimed and running; it spins a little longer.
constexpr auto kCallerSpin = std::chrono::microseconds(50);
// Upper bound on threads so that 4 chunks per thread fit the 16 chunk bits of job_state_.
constexpr int kMaxThreads = 1024;

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until pred() holds or `limit` passes; returns pred()'s last value.
template <typename Pred>
bool SpinFor(std::chrono::microseconds limit, Pred pred) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (pred()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= give_up) return pred();
  }
}

inline uint32_t JobId(uint64_t state) { return static_cast<uint32_t>(state >> 32); }

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads = std::clamp(num_threads, 1, kMaxThreads);
  workers_.reserve(num_threads - 1);
  for (int i = 0; i + 1 < num_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
    pthread_setname_np(workers_.back().native_handle(), "modserve-pool");
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::InsideParallelRegion() { return tls_in_parallel_region; }

void ThreadPool::RunChunks(uint32_t job_id) {
  uint64_t state = job_state_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t next = state & kChunkMask;
    const uint64_t count = (state >> kChunkBits) & kChunkMask;
    if (JobId(state) != job_id || next >= count) return;
    // A successful claim proves the job is still current: it cannot end before this chunk is
    // done, so fn and ctx stay valid while it runs.
    if (!job_state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                          std::memory_order_acquire)) {
      continue;  // `state` was reloaded
    }
    job_fn_(job_ctx_, static_cast<int64_t>(next));
    // Sequentially consistent with caller_sleeping_ (see Run): the caller either sees the count
    // before it sleeps or is seen sleeping here.
    const int64_t done = chunks_done_.fetch_add(1) + 1;
    if (done == static_cast<int64_t>(count) && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
    state = job_state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::Run(int64_t num_chunks, ChunkFn fn, void* ctx) {
  std::lock_guard<std::mutex> run_lock(run_mu_);
  job_fn_ = fn;
  job_ctx_ = ctx;
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint32_t id = ++job_id_;
  // Sequentially consistent with the sleeping_workers_ increment in WorkerLoop: either the
  // worker sees the new job before it sleeps, or this thread sees it sleeping and wakes it.
  job_state_.store((uint64_t{id} << 32) | (static_cast<uint64_t>(num_chunks) << kChunkBits));
  if (sleeping_workers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    work_cv_.notify_all();
  }

  tls_in_parallel_region = true;
  RunChunks(id);
  tls_in_parallel_region = false;

  // What is left are chunks that workers claimed and are running.
  auto all_done = [&] { return chunks_done_.load() == num_chunks; };
  if (SpinFor(kCallerSpin, all_done)) return;
  std::unique_lock<std::mutex> lock(mu_);
  caller_sleeping_.store(true);
  done_cv_.wait(lock, all_done);
  caller_sleeping_.store(false);
}

void ThreadPool::WorkerLoop() {
  tls_in_parallel_region = true;
  uint32_t seen = 0;
  for (;;) {
    auto new_job = [&] { return JobId(job_state_.load()) != seen; };
    if (!SpinFor(kWorkerSpin, new_job)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_workers_.fetch_add(1);
      work_cv_.wait(lock, [&] { return stop_ || new_job(); });
      sleeping_workers_.fetch_sub(1);
      if (stop_) return;
    }
    seen = JobId(job_state_.load(std::memory_order_acquire));
    RunChunks(seen);
  }
}

}  // namespace modserve::backend::cpu
