// A fixed pool of worker threads with a blocking parallel-for over index ranges; the calling
// thread works too. No task queue, futures or work stealing: one parallel region at a time.
#ifndef MODSERVE_ENGINE_BACKEND_CPU_THREAD_POOL_H_
#define MODSERVE_ENGINE_BACKEND_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace modserve::backend::cpu {

// Threads: ParallelFor may be called from any thread; concurrent calls are serialised. A call made
// from inside a running ParallelFor body runs inline on the calling thread (no nested fan-out).
// Idle workers block on a condition variable after a short spin (no busy-waiting while idle).
class ThreadPool {
 public:
  // num_threads counts the caller: 0 means std::thread::hardware_concurrency(); 1 means no
  // workers at all (everything runs inline).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(chunk_begin, chunk_end) over disjoint chunks covering [begin, end), each at least
  // `grain` long (except the last), and returns when all have run. fn must not throw.
  template <typename F>
  void ParallelFor(int64_t begin, int64_t end, int64_t grain, F&& fn) {
    if (end <= begin) return;
    if (grain < 1) grain = 1;
    const int64_t range = end - begin;
    // About 4 chunks per thread balance uneven progress (the machine is shared) without paying
    // much per-chunk overhead.
    int64_t chunk = (range + 4 * num_threads() - 1) / (4 * num_threads());
    if (chunk < grain) chunk = grain;
    const int64_t num_chunks = (range + chunk - 1) / chunk;
    if (num_chunks == 1 || workers_.empty() || InsideParallelRegion()) {
      fn(begin, end);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    struct Ctx {
      Fn* fn;
      int64_t begin, end, chunk;
    } ctx{&fn, begin, end, chunk};
    Run(
        num_chunks,
        [](void* c, int64_t chunk_idx) {
          const Ctx& x = *static_cast<const Ctx*>(c);
          const int64_t b = x.begin + chunk_idx * x.chunk;
          const int64_t e = b + x.chunk < x.end ? b + x.chunk : x.end;
          (*x.fn)(b, e);
        },
        &ctx);
  }

 private:
  using ChunkFn = void (*)(void* ctx, int64_t chunk_idx);

  static bool InsideParallelRegion();
  void Run(int64_t num_chunks, ChunkFn fn, void* ctx);
  void WorkerLoop();
  // Claims and runs chunks of the current job until none are left.
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // serialises Run() callers

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;                    // guarded by mu_
  std::atomic<uint64_t> generation_{0};  // bumped (under mu_) when a job is published
  int workers_pending_ = 0;              // guarded by mu_: workers yet to finish this job

  // The current job; written by Run() before the generation bump, read by workers after it.
  ChunkFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
};

}  // namespace modserve::backend::cpu

#endif  // MODSERVE_ENGINE_BACKEND_CPU_THREAD_POOL_H_
