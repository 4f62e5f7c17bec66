// Worker threads and the publish/claim/complete handshake of ThreadPool::Run.
#include "engine/backend/cpu/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace modserve::backend::cpu {
namespace {

thread_local bool tls_in_parallel_region = false;

// Consecutive ops of one forward pass follow each other within microseconds; a short spin lets a
// worker pick up the next op without a futex wake-up. ~2^12 pauses is a few microseconds.
constexpr int kSpinIterations = 1 << 12;

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (num_threads <= 0) num_threads = 1;
  workers_.reserve(num_threads - 1);
  for (int i = 0; i + 1 < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
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

void ThreadPool::RunChunks() {
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= job_chunks_) return;
    job_fn_(job_ctx_, c);
  }
}

void ThreadPool::Run(int64_t num_chunks, ChunkFn fn, void* ctx) {
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_fn_ = fn;
    job_ctx_ = ctx;
    job_chunks_ = num_chunks;
    next_chunk_.store(0, std::memory_order_relaxed);
    workers_pending_ = static_cast<int>(workers_.size());
    // Release: a worker that sees the new generation also sees the job fields.
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();

  tls_in_parallel_region = true;
  RunChunks();
  tls_in_parallel_region = false;

  // Every worker must check out before the job fields (and fn's stack frame) can be reused.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return workers_pending_ == 0; });
}

void ThreadPool::WorkerLoop() {
  tls_in_parallel_region = true;
  uint64_t seen = 0;
  for (;;) {
    // Spin briefly on the generation before blocking.
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen) break;
      CpuRelax();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock,
                    [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
    }
    RunChunks();
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --workers_pending_ == 0;
    }
    if (last) done_cv_.notify_one();
  }
}

}  // namespace modserve::backend::cpu
