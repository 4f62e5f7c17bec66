// ThreadPool: coverage of the range, chunk sizes, use of several threads, nesting and reuse.
#include "engine/backend/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace modserve::backend::cpu {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 7, 100, 10007}) {
    std::vector<std::atomic<int>> hits(n + 5);
    pool.ParallelFor(5, 5 + n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n + 5; ++i) EXPECT_EQ(hits[i].load(), i >= 5 ? 1 : 0) << n << " " << i;
  }
}

TEST(ThreadPoolTest, ChunksRespectGrain) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.ParallelFor(0, 1000, 300, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(b, e);
  });
  ASSERT_EQ(chunks.size(), 4u);  // 300, 300, 300, 100
  for (auto [b, e] : chunks) EXPECT_TRUE(e - b == 300 || (e == 1000 && e - b == 100)) << b;
}

// ParallelForEach: one index per chunk (44 units on 2 threads run as 22 + 22, where 4 chunks per
// thread would give one thread 24), and still every index once past the 2^16 - 1 chunks a region
// can count.
TEST(ThreadPoolTest, ForEachRunsEveryIndexAsItsOwnChunk) {
  ThreadPool pool(2);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.ParallelForEach(3, 47, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(b, e);
  });
  ASSERT_EQ(chunks.size(), 44u);
  std::set<int64_t> seen;
  for (auto [b, e] : chunks) {
    EXPECT_EQ(e - b, 1) << b;
    seen.insert(b);
  }
  EXPECT_EQ(seen.size(), 44u);
  EXPECT_EQ(*seen.begin(), 3);
  EXPECT_EQ(*seen.rbegin(), 46);
  for (int64_t n : {0, 1, 65535, 65536, 200001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelForEach(0, n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += hits[i].load() != 1;
    EXPECT_EQ(wrong, 0) << n;
  }
}

// ParallelForSpans: every index once, in pieces of at least `grain` (but the last of a span),
// for every thread count, range and grain, including more threads than indices.
TEST(ThreadPoolTest, SpansRunEveryIndexExactlyOnceInPiecesOfTheGrain) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 64, 100, 10007}) {
      for (int64_t grain : {1, 3, 50}) {
        std::vector<std::atomic<int>> hits(n + 5);
        std::atomic<int64_t> short_pieces{0};
        pool.ParallelForSpans(5, 5 + n, grain, [&](int64_t b, int64_t e) {
          if (e - b < grain) short_pieces.fetch_add(1);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        int64_t wrong = 0;
        for (int64_t i = 0; i < n + 5; ++i) wrong += hits[i].load() != (i >= 5 ? 1 : 0);
        EXPECT_EQ(wrong, 0) << threads << " threads, n " << n << ", grain " << grain;
        // Only a span's last piece may be short, and there are at most `threads` spans.
        EXPECT_LE(short_pieces.load(), threads) << n << " " << grain;
      }
    }
  }
}

// The held piece [b, e) of a region over kN indices: waits until every other index has run (as
// counted in `done`), for up to 2 s; true when it did wait and every other index ran meanwhile.
bool HoldUntilTheOthersRan(int64_t b, int64_t e, int64_t kN, const std::atomic<int64_t>& done) {
  const int64_t others = kN - (e - b), at_start = done.load();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (done.load() < others && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  return at_start < others && done.load() == others;
}

// A thread held inside its span's first piece does not hold up the rest of that span: the other
// thread runs its own span and then takes the held span's other pieces from the back. Each piece
// takes 200 us, so the worker is awake and owns a span. (Where one thread owns both spans, the
// hold ends on its 2 s timeout, and only coverage is checked.)
TEST(ThreadPoolTest, SpansOfAHeldThreadAreTakenByTheOther) {
  ThreadPool pool(2);
  constexpr int64_t kN = 64;  // two spans of 32, pieces of 2
  std::vector<std::atomic<int>> hits(kN);
  std::vector<std::thread::id> by(kN);
  std::atomic<int64_t> done{0};
  bool held = false;  // written by the held piece alone, read after the region
  pool.ParallelForSpans(0, kN, 1, [&](int64_t b, int64_t e) {
    if (b == kN / 2) {
      held = HoldUntilTheOthersRan(b, e, kN, done);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (int64_t i = b; i < e; ++i) {
      by[i] = std::this_thread::get_id();
      hits[i].fetch_add(1);
    }
    done.fetch_add(e - b);
  });
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  // Spans owned by two threads: the other one must have freed the hold by taking the rest.
  if (by[0] != by[kN / 2]) {
    EXPECT_TRUE(held) << "the held span's other pieces were not taken";
  }
  if (held) {
    // Every other piece of the held span ran on the other thread.
    for (int64_t i = kN / 2 + 2; i < kN; ++i) EXPECT_NE(by[i], by[kN / 2]) << i;
  }
}

// The other thread takes a held span's pieces from the back in halving ranges, each one call
// over contiguous pieces (one stream for the Gemm's prefetches), not one call per piece: with the
// owner held in piece 0 of 16, the 15 pieces left go as 7, 4, 2, 1 and 1 ([50, 64), [42, 50),
// [38, 42), [36, 38), [34, 36)), each range ending where the one before it began. (An owner that
// starts late changes the first ranges, 8 of 16 pieces, then 4 of the 8 left, and so on, never
// their number or their order.) Taking one piece at a time makes 15 calls.
TEST(ThreadPoolTest, SpansAreTakenFromTheBackInHalvingRanges) {
  ThreadPool pool(2);
  constexpr int64_t kN = 64;  // two spans of 32, pieces of 2
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> taken;  // calls inside the held span, by the other
  std::vector<std::thread::id> by(kN);
  std::atomic<int64_t> done{0};
  std::thread::id holder;
  bool held = false;
  pool.ParallelForSpans(0, kN, 1, [&](int64_t b, int64_t e) {
    if (b == kN / 2) {
      holder = std::this_thread::get_id();
      held = HoldUntilTheOthersRan(b, e, kN, done);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (b > kN / 2) {
        std::lock_guard<std::mutex> lock(mu);
        taken.emplace_back(b, e);
      }
    }
    for (int64_t i = b; i < e; ++i) by[i] = std::this_thread::get_id();
    done.fetch_add(e - b);
  });
  if (by[0] == by[kN / 2]) GTEST_SKIP() << "one thread owned both spans";
  ASSERT_TRUE(held) << "the held span's other pieces were not taken";
  for (int64_t i = kN / 2 + 2; i < kN; ++i) ASSERT_NE(by[i], holder) << i;
  ASSERT_FALSE(taken.empty());
  EXPECT_LE(taken.size(), 5u) << "the held span was taken in " << taken.size() << " calls";
  EXPECT_EQ(taken.front().second, kN);
  EXPECT_EQ(taken.back().first, kN / 2 + 2);
  for (size_t i = 1; i < taken.size(); ++i) {
    EXPECT_EQ(taken[i].second, taken[i - 1].first) << i;
    EXPECT_LE(taken[i].second - taken[i].first, taken[i - 1].second - taken[i - 1].first) << i;
  }
}

TEST(ThreadPoolTest, WorkersParticipate) {
  ThreadPool pool(3);
  ASSERT_EQ(pool.num_threads(), 3);
  // The caller may win every chunk of a small region before a worker wakes, so repeat with
  // enough work per chunk; the test fails only if no worker ever ran a chunk.
  std::mutex mu;
  std::set<std::thread::id> ids;
  for (int attempt = 0; attempt < 200 && ids.size() < 2; ++attempt) {
    pool.ParallelFor(0, 12, 1, [&](int64_t, int64_t) {
      volatile double sink = 0;
      for (int i = 0; i < 20000; ++i) sink = sink + i;
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    });
  }
  EXPECT_GE(ids.size(), 2u);
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(0, 8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(0, 10, 1, [&](int64_t ib, int64_t ie) { sum.fetch_add(ie - ib); });
    }
  });
  EXPECT_EQ(sum.load(), 80);
}

TEST(ThreadPoolTest, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.num_threads(), 1);
  const std::thread::id caller = std::this_thread::get_id();
  pool.ParallelFor(0, 100, 1,
                   [&](int64_t, int64_t) { EXPECT_EQ(std::this_thread::get_id(), caller); });
}

TEST(ThreadPoolTest, ManyConsecutiveRegionsComplete) {
  ThreadPool pool(4);
  int64_t total = 0;
  std::atomic<int64_t> count{0};
  for (int r = 0; r < 2000; ++r) {
    pool.ParallelFor(0, 64, 1, [&](int64_t b, int64_t e) { count.fetch_add(e - b); });
    total += 64;
  }
  EXPECT_EQ(count.load(), total);
}

// Regions separated by idle gaps long enough for the workers to stop spinning and sleep: each
// region must still cover its range exactly once, whether the workers wake in time or not.
TEST(ThreadPoolTest, RegionsAfterIdleGapsComplete) {
  ThreadPool pool(3);
  for (int r = 0; r < 60; ++r) {
    if (r % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200 * (r % 7)));
    std::vector<std::atomic<int>> hits(257);
    pool.ParallelFor(0, 257, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int i = 0; i < 257; ++i) ASSERT_EQ(hits[i].load(), 1) << "region " << r << " index " << i;
  }
}

// Regions submitted from several threads at once are serialised, each complete.
TEST(ThreadPoolTest, ConcurrentCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int r = 0; r < 200; ++r) {
        pool.ParallelFor(0, 100, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
      }
    });
  }
  for (std::thread& c : callers) c.join();
  EXPECT_EQ(sum.load(), 3 * 200 * 100);
}

}  // namespace
}  // namespace modserve::backend::cpu
