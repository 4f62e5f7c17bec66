// Checks BlockTable's page arithmetic and slot numbers against the contract formula.
#include "engine/kv_cache/block_table.h"

#include <vector>

#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

TEST(BlockTableTest, PagesNeededIsCeilOfTotalMinusHeld) {
  BlockTable table(4);
  EXPECT_EQ(table.PagesNeeded(0), 0);
  EXPECT_EQ(table.PagesNeeded(1), 1);
  EXPECT_EQ(table.PagesNeeded(4), 1);
  EXPECT_EQ(table.PagesNeeded(5), 2);
  table.AddPages(std::vector<PageId>{7});
  table.AddTokens(3);
  EXPECT_EQ(table.PagesNeeded(1), 0);
  EXPECT_EQ(table.PagesNeeded(2), 1);
  EXPECT_EQ(table.PagesNeeded(9), 2);
}

TEST(BlockTableTest, SlotFollowsPageAndOffset) {
  BlockTable table(4);
  table.AddPages(std::vector<PageId>{9, 2, 5});
  table.AddTokens(10);
  for (int32_t i = 0; i < 12; ++i) {
    const int64_t page = std::vector<int64_t>{9, 2, 5}[i / 4];
    EXPECT_EQ(table.Slot(i), page * 4 + i % 4) << i;
  }
}

TEST(BlockTableTest, TrimReleasesOnlyUnneededPages) {
  BlockTable table(4);
  table.AddPages(std::vector<PageId>{1, 2, 3});
  table.AddTokens(5);
  std::vector<PageId> released;
  table.TrimTo(&released);
  EXPECT_EQ(released, std::vector<PageId>{3});
  EXPECT_EQ(table.num_pages(), 2);
  table.Clear(&released);
  EXPECT_EQ(released, (std::vector<PageId>{3, 1, 2}));
  EXPECT_EQ(table.num_tokens(), 0);
}

TEST(BlockTableDeathTest, TokensBeyondCapacityCheck) {
  BlockTable table(4);
  table.AddPages(std::vector<PageId>{0});
  EXPECT_DEATH(table.AddTokens(5), "CHECK failed");
  EXPECT_DEATH((void)table.Slot(4), "outside capacity");
}

}  // namespace
}  // namespace modserve::engine
