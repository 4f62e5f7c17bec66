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
// Idle workers block on a condition variable after a short, time-bounded spin (no busy-waiting
// while idle). A region ends when its chunks are done, not when every worker has checked in:
// on a shared machine a worker that is not scheduled simply takes no chunk, and the caller and
// the other workers run them, instead of the region waiting for that worker's next time slice.
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
    // About 4 chunks per thread balance uneven progress (the machine is shared) without paying
    // much per-chunk overhead.
    int64_t chunk = (end - begin + 4 * num_threads() - 1) / (4 * num_threads());
    if (chunk < grain) chunk = grain;
    RunInChunks(begin, end, chunk, fn);
  }

  // ParallelFor with every index a chunk of its own: for a few dozen units of work of a
  // millisecond or so each (the AMX Gemm's tiles), where 4 chunks per thread can leave one
  // thread a whole chunk behind the other (44 tiles in chunks of 6 run as 24 + 20).
  template <typename F>
  void ParallelForEach(int64_t begin, int64_t end, F&& fn) {
    if (end <= begin) return;
    const int64_t range = end - begin;
    RunInChunks(begin, end, range > kMaxChunks ? (range + kMaxChunks - 1) / kMaxChunks : 1, fn);
  }

 private:
  using ChunkFn = void (*)(void* ctx, int64_t chunk_idx);

  // job_state_ packs the job id (high 32 bits), its chunk count (16 bits) and the next chunk to
  // claim (low 16 bits), so a claim is one compare-and-swap that also proves the job is current.
  static constexpr int kChunkBits = 16;
  static constexpr uint64_t kChunkMask = (uint64_t{1} << kChunkBits) - 1;
  static constexpr int64_t kMaxChunks = static_cast<int64_t>(kChunkMask);

  // fn over [begin, end) in chunks of `chunk` indices (the last may be shorter).
  template <typename F>
  void RunInChunks(int64_t begin, int64_t end, int64_t chunk, F& fn) {
    const int64_t num_chunks = (end - begin + chunk - 1) / chunk;
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

  static bool InsideParallelRegion();
  void Run(int64_t num_chunks, ChunkFn fn, void* ctx);
  void WorkerLoop();
  // Claims and runs chunks of job `job_id` until none are left or another job replaced it.
  void RunChunks(uint32_t job_id);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // serialises Run() callers
  uint32_t job_id_ = 0;  // guarded by run_mu_: the id of the latest job

  std::mutex mu_;  // only for sleeping and waking; never held while chunks run
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;  // guarded by mu_
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};

  // The current job: fn and ctx are written by Run() before job_state_ publishes the new id; a
  // worker reads them only after a successful claim of one of that job's chunks, and Run() does
  // not return (or publish another job) before chunks_done_ reaches the job's chunk count.
  std::atomic<uint64_t> job_state_{0};
  ChunkFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  std::atomic<int64_t> chunks_done_{0};
};

}  // namespace modserve::backend::cpu

#endif  // MODSERVE_ENGINE_BACKEND_CPU_THREAD_POOL_H_
