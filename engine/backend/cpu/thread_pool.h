// A fixed pool of worker threads with a blocking parallel-for over index ranges; the calling
// thread works too. No task queue, futures or work stealing: one parallel region at a time.
#ifndef MODSERVE_ENGINE_BACKEND_CPU_THREAD_POOL_H_
#define MODSERVE_ENGINE_BACKEND_CPU_THREAD_POOL_H_

#include <algorithm>
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

  // fn(range_begin, range_end) over [begin, end) as one contiguous span per thread, each cut into
  // kPiecesPerSpan pieces of at least `grain`: a thread runs its span's pieces front to back,
  // then takes from the back of each other span half of the pieces left there (at least one),
  // as one range, until none are left. For streams whose kernels prefetch ahead of them (the
  // decode Gemms' tiles): a thread's pieces follow each other in memory, and so do the pieces of
  // a range it takes, where ParallelFor's chunks, claimed in turn, make every chunk a new
  // stream. A thread that falls behind leaves at most its current piece to wait for, and a span
  // is taken in a few ranges that halve, not in single pieces.
  template <typename F>
  void ParallelForSpans(int64_t begin, int64_t end, int64_t grain, F&& fn) {
    if (end <= begin) return;
    if (grain < 1) grain = 1;
    const int64_t len = end - begin;
    const int64_t spans = std::min<int64_t>(num_threads(), (len + grain - 1) / grain);
    if (spans > kMaxSpans) return ParallelFor(begin, end, grain, fn);
    if (spans <= 1 || InsideParallelRegion()) {
      fn(begin, end);
      return;
    }
    const int64_t piece =
        std::max(grain, (len + spans * kPiecesPerSpan - 1) / (spans * kPiecesPerSpan));
    // Span t: indices [first[t], first[t + 1]); its pieces [next, end) not yet taken, packed as
    // end << 32 | next so that the owner (next) and the others (end) claim with one CAS each.
    struct alignas(64) Span {
      std::atomic<uint64_t> left;
    };
    Span span[kMaxSpans];
    int64_t first[kMaxSpans + 1];
    for (int64_t t = 0; t <= spans; ++t) first[t] = begin + len * t / spans;
    for (int64_t t = 0; t < spans; ++t) {
      const uint64_t pieces = static_cast<uint64_t>((first[t + 1] - first[t] + piece - 1) / piece);
      span[t].left.store(pieces << 32, std::memory_order_relaxed);
    }
    // Claims span t's next piece (front) or the back half of its pieces left (at least one);
    // returns false when none are left, else sets [*k0, *k1) to the pieces claimed.
    auto take = [&](int64_t t, bool front, uint64_t* k0, uint64_t* k1) -> bool {
      uint64_t v = span[t].left.load(std::memory_order_relaxed);
      for (;;) {
        const uint64_t next = v & 0xffffffffu, stop = v >> 32;
        if (next >= stop) return false;
        const uint64_t count = front ? 1 : std::max<uint64_t>(1, (stop - next) / 2);
        const uint64_t taken = front ? v + 1 : ((stop - count) << 32) | next;
        if (span[t].left.compare_exchange_weak(v, taken, std::memory_order_relaxed)) {
          *k0 = front ? next : stop - count;
          *k1 = *k0 + count;
          return true;
        }
      }
    };
    auto run_pieces = [&](int64_t t, uint64_t k0, uint64_t k1) {
      fn(first[t] + static_cast<int64_t>(k0) * piece,
         std::min(first[t + 1], first[t] + static_cast<int64_t>(k1) * piece));
    };
    // Chunk t of the region is span t's owner: whichever thread claims it.
    auto own = [&](int64_t t_begin, int64_t t_end) {
      uint64_t k0, k1;
      for (int64_t t = t_begin; t < t_end; ++t) {
        while (take(t, true, &k0, &k1)) run_pieces(t, k0, k1);
        for (int64_t o = 1; o < spans; ++o) {
          const int64_t u = (t + o) % spans;
          while (take(u, false, &k0, &k1)) run_pieces(u, k0, k1);
        }
      }
    };
    RunInChunks(0, spans, 1, own);
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
  // ParallelForSpans: pieces per span, and the most spans (more threads take ParallelFor's way).
  static constexpr int64_t kPiecesPerSpan = 16;
  static constexpr int64_t kMaxSpans = 64;

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
