// Checks KvCacheManager: status codes, all-or-nothing reservation, slot uniqueness, and exact
// accounting against an independent count driven by seeded random MoD routing decisions.
#include "engine/kv_cache/kv_cache_manager.h"

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

std::unique_ptr<KvCacheManager> MakeManager(int32_t num_pages, int32_t block_size, int32_t n_layers,
                                            int64_t bytes_per_page = 1024) {
  auto manager = KvCacheManager::Create(num_pages, block_size, n_layers, bytes_per_page);
  EXPECT_TRUE(manager.ok()) << manager.status();
  return *std::move(manager);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

TEST(KvCacheManagerTest, CreateRejectsBadArguments) {
  EXPECT_EQ(KvCacheManager::Create(-1, 16, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create(8, 0, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create(8, 16, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create(8, 16, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status status = KvCacheManager::Create(8, 0, 2, 1).status();
  EXPECT_NE(status.message().find("block_size=0"), std::string::npos) << status;
}

TEST(KvCacheManagerTest, BytesPerPageIsKAndVOfOneLayer) {
  // 2 (K, V) * 8 heads * 16 tokens * 128 head_dim * 2 bytes.
  EXPECT_EQ(KvCacheManager::BytesPerPage(8, 16, 128, DType::kBF16), 2 * 8 * 16 * 128 * 2);
  EXPECT_EQ(KvCacheManager::BytesPerPage(1, 4, 8, DType::kF32), 2 * 1 * 4 * 8 * 4);
}

TEST(KvCacheManagerTest, UnknownSequenceIsNotFound) {
  auto kv = MakeManager(8, 4, 2);
  const std::vector<int32_t> counts = {1, 1};
  EXPECT_EQ(kv->Free(42).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->Append(42, 0, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->Reserve(42, counts).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->ReserveCapacity(42, counts).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->Commit(42, counts).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->PagesNeeded(42, counts).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->PageTable(42, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->NumTokens(42, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv->Usage(42).status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(kv->Free(42).message().find("42"), std::string::npos);
}

TEST(KvCacheManagerTest, BadArgumentsAreInvalidArgument) {
  auto kv = MakeManager(8, 4, 2);
  ASSERT_TRUE(kv->AddSequence(1).ok());
  EXPECT_EQ(kv->AddSequence(1).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(kv->Append(1, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->Append(1, -1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->Append(1, 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->Reserve(1, std::vector<int32_t>{1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->NumTokens(1, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->num_free_pages(), 8);
}

TEST(KvCacheManagerTest, AppendGivesSlotsOnOwnPagesAndFreeReturnsThem) {
  auto kv = MakeManager(8, 4, 2);
  ASSERT_TRUE(kv->AddSequence(7).ok());
  auto slots = kv->Append(7, 1, 6);
  ASSERT_TRUE(slots.ok()) << slots.status();
  auto pages = kv->PageTable(7, 1);
  ASSERT_TRUE(pages.ok());
  ASSERT_EQ(pages->size(), 2u);
  for (int32_t i = 0; i < 6; ++i) {
    EXPECT_EQ((*slots)[i], int64_t{(*pages)[i / 4]} * 4 + i % 4) << i;
  }
  EXPECT_EQ(*kv->NumTokens(7, 1), 6);
  EXPECT_EQ(*kv->NumTokens(7, 0), 0);
  EXPECT_TRUE(kv->PageTable(7, 0)->empty());
  // The next entry continues on the partly filled page.
  auto more = kv->Append(7, 1, 1);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ((*more)[0], int64_t{(*pages)[1]} * 4 + 2);
  EXPECT_EQ(kv->num_free_pages(), 6);
  ASSERT_TRUE(kv->Free(7).ok());
  EXPECT_EQ(kv->num_free_pages(), 8);
  EXPECT_FALSE(kv->HasSequence(7));
  const KvCacheStats stats = kv->GetStats();
  EXPECT_EQ(stats.num_used_pages, 0);
  EXPECT_EQ(stats.used_pages_per_layer, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(stats.tokens_per_layer, (std::vector<int64_t>{0, 0}));
}

TEST(KvCacheManagerTest, ExhaustionFailsWholeReserveAndLeavesPoolUnchanged) {
  auto kv = MakeManager(6, 4, 3);
  ASSERT_TRUE(kv->AddSequence(1).ok());
  ASSERT_TRUE(kv->AddSequence(2).ok());
  ASSERT_TRUE(kv->Reserve(1, std::vector<int32_t>{4, 2, 8}).ok());  // 1 + 1 + 2 pages
  const KvCacheStats before = kv->GetStats();
  const std::vector<PageId> table_before(kv->PageTable(1, 1)->begin(), kv->PageTable(1, 1)->end());
  // Sequence 2 needs 1 + 1 + 1 = 3 pages with 2 free.
  const std::vector<int32_t> step = {1, 3, 1};
  ASSERT_EQ(*kv->PagesNeeded(2, step), 3);
  const absl::Status status = kv->Reserve(2, step).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("needs 3 pages, 2 free"), std::string::npos) << status;
  EXPECT_EQ(kv->ReserveCapacity(2, step).status().code(), absl::StatusCode::kResourceExhausted);
  const KvCacheStats after = kv->GetStats();
  EXPECT_EQ(after.num_free_pages, before.num_free_pages);
  EXPECT_EQ(after.used_pages_per_layer, before.used_pages_per_layer);
  EXPECT_EQ(after.tokens_per_layer, before.tokens_per_layer);
  for (int32_t l = 0; l < 3; ++l) {
    EXPECT_EQ(*kv->NumTokens(2, l), 0);
    EXPECT_TRUE(kv->PageTable(2, l)->empty());
  }
  EXPECT_EQ(std::vector<PageId>(kv->PageTable(1, 1)->begin(), kv->PageTable(1, 1)->end()),
            table_before);
  // A request that fits still succeeds afterwards: 1 + 1 + 0 pages for sequence 1.
  EXPECT_TRUE(kv->Reserve(1, std::vector<int32_t>{1, 3, 0}).ok());
  EXPECT_EQ(kv->num_free_pages(), 0);
}

TEST(KvCacheManagerTest, CapacityReservationCommitsActualCountsAndTrims) {
  auto kv = MakeManager(16, 4, 3);
  ASSERT_TRUE(kv->AddSequence(3).ok());
  ASSERT_TRUE(kv->Reserve(3, std::vector<int32_t>{3, 3, 3}).ok());
  // Worst case 6 tokens at every layer: 3 + 6 = 9 entries -> 3 pages per layer.
  auto reserved = kv->ReserveCapacity(3, std::vector<int32_t>{6, 6, 6});
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(kv->GetStats().num_used_pages, 9);
  for (int32_t l = 0; l < 3; ++l) EXPECT_EQ(*kv->NumTokens(3, l), 3);
  // The router kept 6 tokens at layer 0, none at layer 1, 1 at layer 2.
  const std::vector<int32_t> actual = {6, 0, 1};
  // 3 stored + 10 > 12 entries of capacity (3 pages).
  EXPECT_EQ(kv->Commit(3, std::vector<int32_t>{10, 0, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv->Commit(3, actual).ok());
  const std::vector<int32_t> expected_pages = {3, 1, 1};
  const SequenceKvUsage usage = *kv->Usage(3);
  EXPECT_EQ(usage.pages_per_layer, expected_pages);
  EXPECT_EQ(usage.tokens_per_layer, (std::vector<int32_t>{9, 3, 4}));
  EXPECT_EQ(usage.num_pages, 5);
  EXPECT_EQ(usage.bytes, 5 * 1024);
  EXPECT_EQ(kv->num_free_pages(), 11);
  // The committed entries sit exactly where the reservation said the first ones would.
  for (int32_t l = 0; l < 3; ++l) {
    auto pages = *kv->PageTable(3, l);
    const auto slots = reserved->ForLayer(l);
    for (int32_t j = 0; j < actual[l]; ++j) {
      const int32_t entry = 3 + j;
      EXPECT_EQ(slots[j], int64_t{pages[entry / 4]} * 4 + entry % 4) << l << " " << j;
    }
  }
}

// Replays seeded MoD routing for 3 sequences x 4 layers (layers 1 and 3 routed) through both
// write paths and compares every counter with a count kept here: ceil(tokens / block_size) pages
// per (sequence, layer). Also checks that every live slot is unique and inside the pool.
TEST(KvCacheManagerTest, AccountingMatchesRandomRoutingDecisions) {
  constexpr int32_t kNumPages = 4096;
  constexpr int32_t kBlockSize = 8;
  constexpr int32_t kLayers = 4;
  constexpr int64_t kBytesPerPage = 2 * 2 * kBlockSize * 16 * 2;
  const std::vector<bool> routed = {false, true, false, true};
  auto kv = MakeManager(kNumPages, kBlockSize, kLayers, kBytesPerPage);
  std::mt19937 rng(1234);
  std::bernoulli_distribution selected(0.3);

  const std::vector<SequenceId> seqs = {10, 11, 12};
  std::map<SequenceId, std::vector<int64_t>> tokens;  // independent count per (seq, layer)
  std::map<int64_t, std::tuple<SequenceId, int32_t, int64_t>> live;  // slot -> owner entry
  for (SequenceId s : seqs) {
    ASSERT_TRUE(kv->AddSequence(s).ok());
    tokens[s].assign(kLayers, 0);
  }

  auto record = [&](SequenceId s, int32_t l, absl::Span<const int64_t> slots) {
    for (int64_t slot : slots) {
      ASSERT_GE(slot, 0);
      ASSERT_LT(slot, int64_t{kNumPages} * kBlockSize);
      const auto [it, inserted] = live.emplace(slot, std::make_tuple(s, l, tokens[s][l]));
      ASSERT_TRUE(inserted) << "slot " << slot << " handed out twice";
      ++tokens[s][l];
    }
  };

  auto check = [&]() {
    std::vector<int64_t> pages_per_layer(kLayers, 0), tokens_per_layer(kLayers, 0);
    int64_t total_pages = 0;
    for (const auto& [s, counts] : tokens) {
      const SequenceKvUsage usage = *kv->Usage(s);
      int64_t seq_pages = 0;
      for (int32_t l = 0; l < kLayers; ++l) {
        const int64_t pages = CeilDiv(counts[l], kBlockSize);
        EXPECT_EQ(usage.pages_per_layer[l], pages) << "seq " << s << " layer " << l;
        EXPECT_EQ(usage.tokens_per_layer[l], counts[l]);
        EXPECT_EQ(*kv->NumTokens(s, l), counts[l]);
        EXPECT_EQ(static_cast<int64_t>(kv->PageTable(s, l)->size()), pages);
        pages_per_layer[l] += pages;
        tokens_per_layer[l] += counts[l];
        seq_pages += pages;
      }
      EXPECT_EQ(usage.num_pages, seq_pages);
      EXPECT_EQ(usage.bytes, seq_pages * kBytesPerPage);
      total_pages += seq_pages;
    }
    const KvCacheStats stats = kv->GetStats();
    EXPECT_EQ(stats.num_used_pages, total_pages);
    EXPECT_EQ(stats.num_free_pages, kNumPages - total_pages);
    EXPECT_EQ(stats.used_bytes, total_pages * kBytesPerPage);
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(stats.used_pages_per_layer[l], pages_per_layer[l]) << "layer " << l;
      EXPECT_EQ(stats.used_bytes_per_layer[l], pages_per_layer[l] * kBytesPerPage);
      EXPECT_EQ(stats.tokens_per_layer[l], tokens_per_layer[l]);
    }
    // Every live slot still maps to its owner's entry through the page table.
    for (const auto& [slot, owner] : live) {
      const auto& [s, l, entry] = owner;
      const auto pages = *kv->PageTable(s, l);
      ASSERT_EQ(int64_t{pages[entry / kBlockSize]} * kBlockSize + entry % kBlockSize, slot);
    }
  };

  for (int32_t step = 0; step < 60; ++step) {
    for (SequenceId s : seqs) {
      // A prefill chunk of up to 20 tokens on the first steps, then one-token decode.
      const int32_t num_new = step < 3 ? 1 + static_cast<int32_t>(rng() % 20) : 1;
      std::vector<int32_t> counts(kLayers, 0);
      for (int32_t l = 0; l < kLayers; ++l) {
        for (int32_t t = 0; t < num_new; ++t) counts[l] += !routed[l] || selected(rng);
      }
      if (step % 2 == 0) {
        auto reserved = kv->Reserve(s, counts);
        ASSERT_TRUE(reserved.ok()) << reserved.status();
        for (int32_t l = 0; l < kLayers; ++l) record(s, l, reserved->ForLayer(l));
      } else {
        // Worst case first, as the device path does, then the decisions.
        auto reserved = kv->ReserveCapacity(s, std::vector<int32_t>(kLayers, num_new));
        ASSERT_TRUE(reserved.ok()) << reserved.status();
        ASSERT_TRUE(kv->Commit(s, counts).ok());
        for (int32_t l = 0; l < kLayers; ++l) {
          record(s, l, reserved->ForLayer(l).subspan(0, static_cast<size_t>(counts[l])));
        }
      }
    }
    check();
    if (step == 30) {
      // Preempt sequence 11 and restart it: its slots become free for anyone.
      ASSERT_TRUE(kv->Free(11).ok());
      for (auto it = live.begin(); it != live.end();) {
        it = std::get<0>(it->second) == 11 ? live.erase(it) : std::next(it);
      }
      ASSERT_TRUE(kv->AddSequence(11).ok());
      tokens[11].assign(kLayers, 0);
      check();
    }
  }
  // The routed layers hold fewer entries than the dense ones (30% routing).
  const KvCacheStats stats = kv->GetStats();
  EXPECT_LT(stats.tokens_per_layer[1], stats.tokens_per_layer[0]);
  EXPECT_LT(stats.tokens_per_layer[3], stats.tokens_per_layer[2]);
  for (SequenceId s : seqs) ASSERT_TRUE(kv->Free(s).ok());
  const KvCacheStats empty = kv->GetStats();
  EXPECT_EQ(empty.num_used_pages, 0);
  EXPECT_EQ(empty.num_free_pages, kNumPages);
  EXPECT_EQ(empty.used_bytes, 0);
  EXPECT_EQ(empty.num_sequences, 0);
  EXPECT_EQ(empty.used_pages_per_layer, std::vector<int32_t>(kLayers, 0));
  EXPECT_EQ(empty.tokens_per_layer, std::vector<int64_t>(kLayers, 0));
}

TEST(KvCacheManagerTest, TruncateMatchesASequenceThatNeverHeldTheDroppedEntries) {
  // Random appends and rollbacks on a 3-layer cache (layer 1 sparse); after each rollback the
  // pages, entries and free pages equal those of a sequence that appended the kept counts only.
  constexpr int32_t kBlock = 4, kLayers = 3, kPages = 64;
  auto kv = MakeManager(kPages, kBlock, kLayers);
  std::mt19937 rng(17);
  ASSERT_TRUE(kv->AddSequence(1).ok());
  std::vector<int32_t> held(kLayers, 0);
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> add(kLayers);
    const int32_t n = static_cast<int32_t>(rng() % 6);
    for (int32_t l = 0; l < kLayers; ++l) add[l] = l == 1 ? static_cast<int32_t>(rng() % (n + 1)) : n;
    if (!kv->Reserve(1, add).ok()) break;
    for (int32_t l = 0; l < kLayers; ++l) held[l] += add[l];
    std::vector<int32_t> keep(kLayers);
    for (int32_t l = 0; l < kLayers; ++l) keep[l] = held[l] - static_cast<int32_t>(rng() % (add[l] + 1));
    ASSERT_TRUE(kv->Truncate(1, keep).ok());
    held = keep;
    auto usage = kv->Usage(1);
    ASSERT_TRUE(usage.ok());
    int32_t pages = 0;
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(usage->tokens_per_layer[l], held[l]);
      EXPECT_EQ(usage->pages_per_layer[l], CeilDiv(held[l], kBlock));
      pages += static_cast<int32_t>(CeilDiv(held[l], kBlock));
    }
    EXPECT_EQ(kv->GetStats().num_free_pages, kPages - pages);
  }
  EXPECT_EQ(kv->Truncate(1, std::vector<int32_t>{held[0] + 1, 0, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->Truncate(1, std::vector<int32_t>{-1, 0, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->Truncate(7, std::vector<int32_t>{0, 0, 0}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*kv->NumTokens(1, 0), held[0]);
  ASSERT_TRUE(kv->Truncate(1, std::vector<int32_t>{0, 0, 0}).ok());
  EXPECT_EQ(kv->GetStats().num_free_pages, kPages);
}

TEST(KvCacheManagerTest, PagesNeededPredictsGrowth) {
  auto kv = MakeManager(64, 4, 2);
  ASSERT_TRUE(kv->AddSequence(1).ok());
  const std::vector<int32_t> first = {5, 0};
  EXPECT_EQ(*kv->PagesNeededForNew(first), 2);
  EXPECT_EQ(*kv->PagesNeeded(1, first), 2);
  ASSERT_TRUE(kv->Reserve(1, first).ok());
  const std::vector<int32_t> second = {3, 9};
  const int32_t predicted = *kv->PagesNeeded(1, second);
  EXPECT_EQ(predicted, 0 + 3);
  const int32_t free_before = kv->num_free_pages();
  ASSERT_TRUE(kv->Reserve(1, second).ok());
  EXPECT_EQ(free_before - kv->num_free_pages(), predicted);
}

}  // namespace
}  // namespace modserve::engine
