// Checks prefix caching in KvCacheManager: blocks keyed by chained token hashes and a salt,
// attachment of a cached chain, copy-on-write of a shared partial page, LRU eviction of leaves,
// and page references returning to the pool. A shadow model of page contents (one "value" per
// slot) checks that an attached sequence reads what the caching sequence wrote.
#include "engine/kv_cache/prefix_cache.h"

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "engine/kv_cache/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

constexpr int32_t kBlock = 4;
constexpr int32_t kLayers = 2;  // layer 0 dense, layer 1 routed

std::unique_ptr<KvCacheManager> MakeManager(int32_t num_pages) {
  auto kv = KvCacheManager::Create(num_pages, kBlock, kLayers, 64);
  EXPECT_TRUE(kv.ok()) << kv.status();
  (*kv)->EnablePrefixCache();
  return *std::move(kv);
}

// Page contents as the backend would hold them: slot -> the value written there.
class ShadowPool {
 public:
  void Write(const ReservedSlots& r, int32_t layer, absl::Span<const int64_t> values) {
    for (const PageCopy& c : r.copies) Copy(c);
    const absl::Span<const int64_t> slots = r.ForLayer(layer);
    ASSERT_EQ(slots.size(), values.size());
    for (size_t i = 0; i < slots.size(); ++i) slot_[slots[i]] = values[i];
  }
  void ApplyCopies(const ReservedSlots& r) {
    for (const PageCopy& c : r.copies) Copy(c);
  }
  // Entries of (seq, layer) in order, read through its page table.
  std::vector<int64_t> Read(const KvCacheManager& kv, SequenceId seq, int32_t layer) const {
    std::vector<int64_t> out;
    const int32_t n = *kv.NumTokens(seq, layer);
    const absl::Span<const PageId> pages = *kv.PageTable(seq, layer);
    for (int32_t i = 0; i < n; ++i) {
      const int64_t slot = int64_t{pages[i / kBlock]} * kBlock + i % kBlock;
      auto it = slot_.find(slot);
      out.push_back(it == slot_.end() ? -1 : it->second);
    }
    return out;
  }

 private:
  void Copy(const PageCopy& c) {
    for (int32_t o = 0; o < kBlock; ++o) {
      auto it = slot_.find(int64_t{c.src} * kBlock + o);
      if (it != slot_.end()) slot_[int64_t{c.dst} * kBlock + o] = it->second;
    }
  }
  std::map<int64_t, int64_t> slot_;
};

// Feeds `values.size()` tokens to seq: every one at layer 0, those with routed[i] at layer 1.
// Entry values are the token positions (times 10 at layer 1), so reads can be checked.
void Feed(KvCacheManager& kv, ShadowPool& shadow, SequenceId seq, int32_t first_pos,
          const std::vector<bool>& routed) {
  std::vector<int64_t> dense, sparse;
  for (size_t i = 0; i < routed.size(); ++i) {
    dense.push_back(first_pos + static_cast<int64_t>(i));
    if (routed[i]) sparse.push_back(10 * (first_pos + static_cast<int64_t>(i)));
  }
  const std::vector<int32_t> counts = {static_cast<int32_t>(dense.size()),
                                       static_cast<int32_t>(sparse.size())};
  auto r = kv.Reserve(seq, counts);
  ASSERT_TRUE(r.ok()) << r.status();
  shadow.Write(*r, 0, dense);
  shadow.Write(*r, 1, sparse);
}

std::vector<int32_t> Tokens(int32_t n, int32_t base = 100) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}

// Adds sequence `seq`, feeds it the 8 `tokens` with layer 1 taking tokens 1, 5 and 6, and caches
// both 4-token blocks (salt 9): layer 1 then holds 1 entry after block 0 and 3 after block 1, on
// one partial page that both blocks share.
void FeedAndCacheTwoBlocks(KvCacheManager& kv, ShadowPool& shadow, SequenceId seq,
                           const std::vector<int32_t>& tokens) {
  ASSERT_TRUE(kv.AddSequence(seq).ok());
  Feed(kv, shadow, seq, 0, {false, true, false, false, false, true, true, false});
  auto k0 = kv.CacheBlock(seq, 0, absl::MakeConstSpan(tokens).subspan(0, 4), 9, {4, 1}, {});
  ASSERT_TRUE(k0.ok() && *k0 != 0) << k0.status();
  auto k1 = kv.CacheBlock(seq, *k0, absl::MakeConstSpan(tokens).subspan(4, 4), 9, {8, 3}, {});
  ASSERT_TRUE(k1.ok() && *k1 != 0) << k1.status();
}

TEST(PrefixCacheTest, KeyDependsOnParentTokensAndSalt) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_NE(PrefixCache::Key(0, a, 0), PrefixCache::Key(0, b, 0));
  EXPECT_NE(PrefixCache::Key(0, a, 0), PrefixCache::Key(0, a, 7));
  EXPECT_NE(PrefixCache::Key(0, a, 0), PrefixCache::Key(PrefixCache::Key(0, a, 0), a, 0));
  EXPECT_EQ(PrefixCache::Key(0, a, 3), PrefixCache::Key(0, a, 3));
  EXPECT_NE(PrefixCache::Key(0, a, 0), 0u);
}

TEST(PrefixCacheTest, AttachedSequenceReadsTheCachedEntriesAndCopiesTheSharedPartialPage) {
  auto kv = MakeManager(32);
  ShadowPool shadow;
  const std::vector<int32_t> tokens = Tokens(8);
  ASSERT_NO_FATAL_FAILURE(FeedAndCacheTwoBlocks(*kv, shadow, 1, tokens));
  // The owner keeps appending to its own partial page in place: no copy.
  auto own = kv->Reserve(1, {1, 1});
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE(own->copies.empty());
  shadow.Write(*own, 0, {8});
  shadow.Write(*own, 1, {80});
  const std::vector<int64_t> owner_sparse = shadow.Read(*kv, 1, 1);

  // Another sequence with the same 8 tokens plus more attaches both blocks.
  std::vector<int32_t> longer = tokens;
  longer.push_back(7);
  longer.push_back(7);
  ASSERT_TRUE(kv->AddSequence(2).ok());
  auto chain = kv->AttachCachedPrefix(2, longer, 9);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), 2u);
  EXPECT_EQ(*kv->NumTokens(2, 0), 8);
  EXPECT_EQ(*kv->NumTokens(2, 1), 3);
  EXPECT_EQ(shadow.Read(*kv, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(shadow.Read(*kv, 2, 1), (std::vector<int64_t>{10, 50, 60}));
  const PageId shared = (*kv->PageTable(2, 1))[0];
  EXPECT_EQ(shared, (*kv->PageTable(1, 1))[0]);

  // Appending at layer 1 copies the shared page first; layer 0 starts a fresh page.
  auto r = kv->Reserve(2, {1, 1});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->copies.size(), 1u);
  EXPECT_EQ(r->copies[0].src, shared);
  shadow.Write(*r, 0, {-8});
  shadow.Write(*r, 1, {-80});
  EXPECT_NE((*kv->PageTable(2, 1))[0], shared);
  EXPECT_EQ(shadow.Read(*kv, 2, 1), (std::vector<int64_t>{10, 50, 60, -80}));
  EXPECT_EQ(shadow.Read(*kv, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, -8}));
  // Neither the owner nor the cache saw the other's writes.
  EXPECT_EQ(shadow.Read(*kv, 1, 1), owner_sparse);
  ASSERT_TRUE(kv->AddSequence(3).ok());
  ASSERT_TRUE(kv->AttachCachedPrefix(3, longer, 9).ok());
  EXPECT_EQ(shadow.Read(*kv, 3, 1), (std::vector<int64_t>{10, 50, 60}));

  // Everything back: sequences hold nothing, and the pool is empty once the cache is cleared.
  for (SequenceId s : {1, 2, 3}) ASSERT_TRUE(kv->Free(s).ok());
  KvCacheStats st = kv->GetStats();
  EXPECT_EQ(st.num_used_pages, 0);
  EXPECT_EQ(st.num_free_pages, 32);
  EXPECT_EQ(st.num_referenced_pages, st.num_prefix_cache_pages);
  EXPECT_EQ(st.num_prefix_cache_blocks, 2);
  kv->ClearPrefixCache();
  st = kv->GetStats();
  EXPECT_EQ(st.num_referenced_pages, 0);
  EXPECT_EQ(st.num_prefix_cache_blocks, 0);
}

TEST(PrefixCacheTest, TruncateFreesEmptiedPagesAndNeverOverwritesEntriesOthersRead) {
  auto kv = MakeManager(32);
  ShadowPool shadow;
  const std::vector<int32_t> tokens = Tokens(8);
  ASSERT_NO_FATAL_FAILURE(FeedAndCacheTwoBlocks(*kv, shadow, 1, tokens));
  const int32_t free_before = kv->GetStats().num_free_pages;

  // Speculative entries past the cached ones, then rolled back: the page they alone filled
  // goes back to the pool, and the kept entries are untouched.
  Feed(*kv, shadow, 1, 8, {true, true});
  EXPECT_EQ(*kv->NumTokens(1, 1), 5);
  EXPECT_EQ(kv->PageTable(1, 1)->size(), 2u);
  EXPECT_EQ(kv->Truncate(1, {12, 4}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv->Truncate(1, {9, 4}).ok());
  EXPECT_EQ(kv->PageTable(1, 1)->size(), 1u);
  EXPECT_EQ(*kv->NumTokens(1, 0), 9);
  EXPECT_EQ(shadow.Read(*kv, 1, 1), (std::vector<int64_t>{10, 50, 60, 80}));
  ASSERT_TRUE(kv->Truncate(1, {8, 3}).ok());
  EXPECT_EQ(kv->GetStats().num_free_pages, free_before);
  EXPECT_EQ(kv->GetStats().tokens_per_layer, (std::vector<int64_t>{8, 3}));

  // Past the published entries the owner appends in place, as before the rollback.
  auto in_place = kv->Reserve(1, {1, 1});
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  EXPECT_TRUE(in_place->copies.empty());
  shadow.Write(*in_place, 0, {8});
  shadow.Write(*in_place, 1, {80});
  ASSERT_TRUE(kv->Truncate(1, {8, 3}).ok());

  // Rolled back into entries the cache publishes: the next append copies the page first.
  const PageId shared = (*kv->PageTable(1, 1))[0];
  ASSERT_TRUE(kv->Truncate(1, {8, 2}).ok());
  auto copied = kv->Reserve(1, {0, 1});
  ASSERT_TRUE(copied.ok()) << copied.status();
  ASSERT_EQ(copied->copies.size(), 1u);
  EXPECT_EQ(copied->copies[0].src, shared);
  shadow.Write(*copied, 1, {-1});
  EXPECT_EQ(shadow.Read(*kv, 1, 1), (std::vector<int64_t>{10, 50, -1}));
  ASSERT_TRUE(kv->AddSequence(2).ok());
  std::vector<int32_t> longer = tokens;
  longer.push_back(7);
  ASSERT_EQ(kv->AttachCachedPrefix(2, longer, 9)->size(), 2u);
  EXPECT_EQ(shadow.Read(*kv, 2, 1), (std::vector<int64_t>{10, 50, 60}));

  // An attached sequence rolls back its own appends; its copy of the shared page is private.
  Feed(*kv, shadow, 2, 8, {false, true});
  ASSERT_TRUE(kv->Truncate(2, {8, 3}).ok());
  EXPECT_EQ(shadow.Read(*kv, 2, 1), (std::vector<int64_t>{10, 50, 60}));
  ASSERT_TRUE(kv->AddSequence(3).ok());
  ASSERT_EQ(kv->AttachCachedPrefix(3, longer, 9)->size(), 2u);
  EXPECT_EQ(shadow.Read(*kv, 3, 1), (std::vector<int64_t>{10, 50, 60}));

  for (SequenceId s : {1, 2, 3}) ASSERT_TRUE(kv->Free(s).ok());
  kv->ClearPrefixCache();
  EXPECT_EQ(kv->GetStats().num_referenced_pages, 0);
}

TEST(PrefixCacheTest, OnlyTheSameSaltAndWholeBlocksMatch) {
  auto kv = MakeManager(32);
  ShadowPool shadow;
  const std::vector<int32_t> tokens = Tokens(8);
  ASSERT_TRUE(kv->AddSequence(1).ok());
  Feed(*kv, shadow, 1, 0, std::vector<bool>(8, true));
  auto k0 = kv->CacheBlock(1, 0, absl::MakeConstSpan(tokens).subspan(0, 4), 1, {4, 4}, {});
  ASSERT_TRUE(k0.ok() && *k0 != 0);
  ASSERT_TRUE(kv->AddSequence(2).ok());
  EXPECT_TRUE(kv->AttachCachedPrefix(2, tokens, 2)->empty());           // other salt
  EXPECT_TRUE(kv->AttachCachedPrefix(2, Tokens(3), 1)->empty());        // not a whole block
  EXPECT_TRUE(kv->AttachCachedPrefix(2, Tokens(8, 101), 1)->empty());   // other tokens
  EXPECT_EQ(kv->AttachCachedPrefix(2, tokens, 1)->size(), 1u);
  // A sequence that holds entries cannot attach; an identical block is not cached twice.
  EXPECT_EQ(kv->AttachCachedPrefix(2, tokens, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*kv->CacheBlock(1, 0, absl::MakeConstSpan(tokens).subspan(0, 4), 1, {4, 4}, {}), 0u);
  // A block whose parent is not cached is not cached either.
  EXPECT_EQ(*kv->CacheBlock(1, 12345, absl::MakeConstSpan(tokens).subspan(4, 4), 1, {8, 8}, {}),
            0u);
  // Counts beyond what the sequence holds are refused.
  EXPECT_EQ(kv->CacheBlock(1, *k0, absl::MakeConstSpan(tokens).subspan(4, 4), 1, {8, 9}, {})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PrefixCacheTest, AllocationEvictsLeastRecentlyUsedLeavesAndNeverReferencedPages) {
  // 8 pages. Three cached single-block chains of 2 pages each (dense at both layers).
  auto kv = MakeManager(8);
  ShadowPool shadow;
  std::vector<uint64_t> keys;
  for (int32_t c = 0; c < 3; ++c) {
    const std::vector<int32_t> t = Tokens(4, 1000 * (c + 1));
    ASSERT_TRUE(kv->AddSequence(c + 1).ok());
    Feed(*kv, shadow, c + 1, 0, std::vector<bool>(4, true));
    auto k = kv->CacheBlock(c + 1, 0, t, 0, {4, 4}, {});
    ASSERT_TRUE(k.ok() && *k != 0);
    keys.push_back(*k);
    ASSERT_TRUE(kv->Free(c + 1).ok());
  }
  EXPECT_EQ(kv->GetStats().num_free_pages, 8);
  EXPECT_EQ(kv->GetStats().num_referenced_pages, 6);
  // Chain 1 (the oldest) is used again; then a sequence attached to chain 2 keeps its pages.
  ASSERT_TRUE(kv->AddSequence(10).ok());
  ASSERT_EQ(kv->AttachCachedPrefix(10, Tokens(5, 1000), 0)->size(), 1u);
  ASSERT_TRUE(kv->Free(10).ok());
  ASSERT_TRUE(kv->AddSequence(11).ok());
  ASSERT_EQ(kv->AttachCachedPrefix(11, Tokens(5, 2000), 0)->size(), 1u);
  // Sequence 11 holds chain 2's 2 pages, so 6 pages are free for the taking; asking for 6 new
  // ones evicts chain 3 (least recently used) and then chain 1, never what 11 uses.
  ASSERT_TRUE(kv->AddSequence(12).ok());
  EXPECT_EQ(kv->GetStats().num_free_pages, 6);
  auto r = kv->Reserve(12, {12, 12});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(kv->GetStats().num_free_pages, 0);
  EXPECT_EQ(shadow.Read(*kv, 11, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  // Nothing more to give: chain 2's pages are referenced by sequence 11.
  EXPECT_EQ(kv->Reserve(12, {1, 0}).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv->Free(12).ok());
  ASSERT_TRUE(kv->Free(11).ok());
  // Chain 2 was not evicted (evicting it would have freed nothing) and still matches.
  EXPECT_EQ(kv->GetStats().num_prefix_cache_blocks, 1);
  EXPECT_EQ(kv->GetStats().num_referenced_pages, 2);
  ASSERT_TRUE(kv->AddSequence(13).ok());
  EXPECT_TRUE(kv->AttachCachedPrefix(13, Tokens(5, 1000), 0)->empty());
  EXPECT_TRUE(kv->AttachCachedPrefix(13, Tokens(5, 3000), 0)->empty());
  EXPECT_EQ(kv->AttachCachedPrefix(13, Tokens(5, 2000), 0)->size(), 1u);
}

TEST(PrefixCacheTest, ParentsOutliveTheirChildren) {
  auto kv = MakeManager(6);
  ShadowPool shadow;
  const std::vector<int32_t> t = Tokens(8);
  ASSERT_TRUE(kv->AddSequence(1).ok());
  Feed(*kv, shadow, 1, 0, std::vector<bool>(8, true));
  auto k0 = kv->CacheBlock(1, 0, absl::MakeConstSpan(t).subspan(0, 4), 0, {4, 4}, {});
  auto k1 = kv->CacheBlock(1, *k0, absl::MakeConstSpan(t).subspan(4, 4), 0, {8, 8}, {});
  ASSERT_TRUE(k1.ok() && *k1 != 0);
  ASSERT_TRUE(kv->Free(1).ok());
  // Three pages needed, two free: the leaf (block 1) goes, its parent stays and still matches.
  ASSERT_TRUE(kv->AddSequence(2).ok());
  ASSERT_TRUE(kv->Reserve(2, {8, 4}).ok());
  EXPECT_EQ(kv->GetStats().num_prefix_cache_blocks, 1);
  ASSERT_TRUE(kv->AddSequence(3).ok());
  EXPECT_EQ(kv->AttachCachedPrefix(3, t, 0)->size(), 1u);
}

// Random sequences over a few shared prefixes: caching, attaching, appending, freeing and
// evicting in random order. Every attached sequence reads exactly what its prefix's first
// writer wrote, and the pool ends empty.
TEST(PrefixCacheTest, RandomizedInterleavingsKeepContentsAndReferencesExact) {
  std::mt19937 rng(7);
  auto kv = MakeManager(48);
  ShadowPool shadow;
  // Routing of a token at layer 1 is a function of the token (as causal routing is of the
  // prefix), so equal prefixes route equally.
  auto routed = [](int32_t token) { return token % 3 == 0; };
  // An entry's value: a hash of the tokens up to it, as a KV entry is a function of its prefix.
  auto value = [](const std::vector<int32_t>& tokens, int32_t pos) {
    int64_t h = 17;
    for (int32_t i = 0; i <= pos; ++i) h = (h * 1000003 + tokens[i]) % (int64_t{1} << 40);
    return h;
  };
  struct Seq {
    std::vector<int32_t> tokens;
    int32_t fed = 0;
    uint64_t key = 0;
    int32_t blocks = 0;
    bool stopped = false;
  };
  std::map<SequenceId, Seq> live;
  SequenceId next = 1;
  const std::vector<std::vector<int32_t>> prefixes = {Tokens(9, 30), Tokens(13, 60),
                                                      Tokens(4, 90)};
  for (int step = 0; step < 400; ++step) {
    const int action = static_cast<int>(rng() % 4);
    if (action == 0 || live.empty()) {
      Seq s;
      s.tokens = prefixes[rng() % prefixes.size()];
      const int extra = static_cast<int>(rng() % 9);
      for (int i = 0; i < extra; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 200));
      const SequenceId id = next++;
      ASSERT_TRUE(kv->AddSequence(id).ok());
      auto chain = kv->AttachCachedPrefix(
          id, absl::MakeConstSpan(s.tokens).first(s.tokens.size() - 1), 5);
      ASSERT_TRUE(chain.ok());
      if (!chain->empty()) {
        s.fed = static_cast<int32_t>(chain->size()) * kBlock;
        s.key = chain->back()->key;
        s.blocks = static_cast<int32_t>(chain->size());
      }
      live.emplace(id, s);
      continue;
    }
    auto it = live.begin();
    std::advance(it, rng() % live.size());
    const SequenceId id = it->first;
    Seq& s = it->second;
    if (action == 3 || s.fed == static_cast<int32_t>(s.tokens.size())) {
      ASSERT_TRUE(kv->Free(id).ok());
      live.erase(it);
      continue;
    }
    // Feed a chunk; on ResourceExhausted free some other sequence and move on.
    const int32_t n = std::min<int32_t>(1 + static_cast<int32_t>(rng() % 6),
                                        static_cast<int32_t>(s.tokens.size()) - s.fed);
    std::vector<int64_t> dense, sparse;
    for (int32_t i = 0; i < n; ++i) {
      dense.push_back(value(s.tokens, s.fed + i));
      if (routed(s.tokens[s.fed + i])) sparse.push_back(-value(s.tokens, s.fed + i));
    }
    auto r = kv->Reserve(id, {n, static_cast<int32_t>(sparse.size())});
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
      ASSERT_TRUE(kv->Free(id).ok());
      live.erase(it);
      continue;
    }
    shadow.Write(*r, 0, dense);
    shadow.Write(*r, 1, sparse);
    s.fed += n;
    while (!s.stopped && (s.blocks + 1) * kBlock <= s.fed) {
      const int32_t end = (s.blocks + 1) * kBlock;
      int32_t routed_count = 0;
      for (int32_t i = 0; i < end; ++i) routed_count += routed(s.tokens[i]);
      auto k = kv->CacheBlock(id, s.key, absl::MakeConstSpan(s.tokens).subspan(end - kBlock, kBlock),
                              5, {end, routed_count}, {});
      ASSERT_TRUE(k.ok()) << k.status();
      if (*k == 0) {
        s.stopped = true;
      } else {
        s.key = *k;
        ++s.blocks;
      }
    }
    // What the sequence reads is what a private computation of its tokens would have written.
    std::vector<int64_t> want_dense, want_sparse;
    for (int32_t i = 0; i < s.fed; ++i) {
      want_dense.push_back(value(s.tokens, i));
      if (routed(s.tokens[i])) want_sparse.push_back(-value(s.tokens, i));
    }
    ASSERT_EQ(shadow.Read(*kv, id, 0), want_dense) << "step " << step;
    ASSERT_EQ(shadow.Read(*kv, id, 1), want_sparse) << "step " << step;
  }
  for (const auto& [id, s] : live) ASSERT_TRUE(kv->Free(id).ok());
  KvCacheStats st = kv->GetStats();
  EXPECT_EQ(st.num_used_pages, 0);
  EXPECT_EQ(st.num_referenced_pages, st.num_prefix_cache_pages);
  kv->ClearPrefixCache();
  EXPECT_EQ(kv->GetStats().num_referenced_pages, 0);
}

}  // namespace
}  // namespace modserve::engine
