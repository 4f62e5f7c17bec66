// ThreadPool: coverage of the range, chunk sizes, use of several threads, nesting and reuse.
#include "engine/backend/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
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
