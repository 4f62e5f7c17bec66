// Checks BlockPool: all-or-nothing allocation, refcounts, FIFO reuse and CHECKs on misuse.
#include "engine/kv_cache/block_pool.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

TEST(BlockPoolTest, AllocateReturnsEveryIdOnceThenExhausts) {
  BlockPool pool(8);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.Allocate(5, &pages).ok());
  ASSERT_TRUE(pool.Allocate(3, &pages).ok());
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.num_used(), 8);
  std::vector<PageId> sorted = pages;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<PageId>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (PageId p : pages) EXPECT_EQ(pool.RefCount(p), 1);
  EXPECT_EQ(pool.Allocate(1, &pages).code(), absl::StatusCode::kResourceExhausted);
}

TEST(BlockPoolTest, FailedAllocateChangesNothing) {
  BlockPool pool(4);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.Allocate(3, &pages).ok());
  const absl::Status status = pool.Allocate(2, &pages);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("needs 2 pages, 1 free"), std::string::npos) << status;
  EXPECT_EQ(pages.size(), 3u);
  EXPECT_EQ(pool.num_free(), 1);
}

TEST(BlockPoolTest, RoundTripRestoresPool) {
  BlockPool pool(16);
  for (int round = 0; round < 5; ++round) {
    std::vector<PageId> pages;
    ASSERT_TRUE(pool.Allocate(16, &pages).ok());
    EXPECT_EQ(pool.num_free(), 0);
    pool.Release(pages);
    EXPECT_EQ(pool.num_free(), 16);
    for (PageId p = 0; p < 16; ++p) EXPECT_EQ(pool.RefCount(p), 0);
  }
}

TEST(BlockPoolTest, FreedPagesAreReusedLeastRecentlyFreedFirst) {
  BlockPool pool(4);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.Allocate(4, &pages).ok());
  pool.Release(pages[2]);
  pool.Release(pages[0]);
  std::vector<PageId> again;
  ASSERT_TRUE(pool.Allocate(2, &again).ok());
  EXPECT_EQ(again, (std::vector<PageId>{pages[2], pages[0]}));
}

TEST(BlockPoolTest, RefCountKeepsSharedPageUntilLastRelease) {
  BlockPool pool(2);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.Allocate(1, &pages).ok());
  pool.IncRef(pages[0]);
  EXPECT_EQ(pool.RefCount(pages[0]), 2);
  pool.Release(pages[0]);
  EXPECT_EQ(pool.num_free(), 1);
  pool.Release(pages[0]);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPoolTest, AllocateZeroIsOkEvenWhenEmpty) {
  BlockPool pool(0);
  std::vector<PageId> pages;
  EXPECT_TRUE(pool.Allocate(0, &pages).ok());
  EXPECT_TRUE(pages.empty());
}

TEST(BlockPoolDeathTest, DoubleFreeChecks) {
  BlockPool pool(2);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.Allocate(1, &pages).ok());
  pool.Release(pages[0]);
  EXPECT_DEATH(pool.Release(pages[0]), "double free");
}

TEST(BlockPoolDeathTest, OutOfRangeIdChecks) {
  BlockPool pool(2);
  EXPECT_DEATH(pool.Release(2), "outside pool");
  EXPECT_DEATH(pool.IncRef(-1), "outside pool");
}

TEST(BlockPoolDeathTest, IncRefOnFreePageChecks) {
  BlockPool pool(2);
  EXPECT_DEATH(pool.IncRef(0), "free page");
}

}  // namespace
}  // namespace modserve::engine
