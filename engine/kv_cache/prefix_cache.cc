// PrefixCache: a hash-chained map of blocks with LRU eviction of leaves.
#include "engine/kv_cache/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "engine/common/logging.h"

namespace modserve::engine {
namespace {

// SplitMix64's finalizer: a cheap 64-bit mix. Keys are verified against the stored tokens, so
// a collision costs a miss, never a wrong reuse.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace

PrefixCache::PrefixCache(int32_t block_size, int32_t n_layers, BlockPool* pool)
    : block_size_(block_size), n_layers_(n_layers), pool_(pool) {}

PrefixCache::~PrefixCache() { Clear(); }

uint64_t PrefixCache::Key(uint64_t parent, absl::Span<const int32_t> tokens, uint64_t salt) {
  uint64_t h = Mix(parent ^ 0x9E3779B97F4A7C15ull) ^ Mix(salt + 0x632BE59BD9B4E019ull);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;  // 0 means "no parent"
}

const PrefixBlock* PrefixCache::Find(uint64_t key) const {
  auto it = blocks_.find(key);
  return it == blocks_.end() ? nullptr : &it->second;
}

std::vector<const PrefixBlock*> PrefixCache::Match(absl::Span<const int32_t> tokens,
                                                   uint64_t salt) {
  std::vector<const PrefixBlock*> chain;
  uint64_t parent = 0;
  ++clock_;
  for (size_t start = 0; start + block_size_ <= tokens.size(); start += block_size_) {
    const absl::Span<const int32_t> block = tokens.subspan(start, block_size_);
    auto it = blocks_.find(Key(parent, block, salt));
    if (it == blocks_.end() || it->second.parent != parent || it->second.salt != salt ||
        !std::equal(block.begin(), block.end(), it->second.tokens.begin())) {
      break;
    }
    it->second.last_used = clock_;
    chain.push_back(&it->second);
    parent = it->first;
  }
  return chain;
}

void PrefixCache::ChainState(absl::Span<const PrefixBlock* const> chain,
                             std::vector<std::vector<PageId>>* pages,
                             std::vector<int32_t>* counts) const {
  MODSERVE_CHECK(!chain.empty());
  pages->assign(static_cast<size_t>(n_layers_), {});
  for (const PrefixBlock* b : chain) {
    for (int32_t l = 0; l < n_layers_; ++l) {
      std::vector<PageId>& list = (*pages)[l];
      MODSERVE_CHECK_LE(b->first_page[l], static_cast<int32_t>(list.size()));
      list.resize(static_cast<size_t>(b->first_page[l]));
      list.insert(list.end(), b->pages[l].begin(), b->pages[l].end());
    }
  }
  *counts = chain.back()->num_entries;
}

bool PrefixCache::Insert(PrefixBlock block) {
  if (blocks_.contains(block.key)) return false;
  if (block.parent != 0) {
    auto parent = blocks_.find(block.parent);
    if (parent == blocks_.end()) return false;
    ++parent->second.num_children;
  }
  for (const std::vector<PageId>& layer : block.pages) {
    for (PageId p : layer) pool_->IncRef(p);
    num_pages_ += static_cast<int32_t>(layer.size());
  }
  block.last_used = ++clock_;
  block.num_children = 0;
  const uint64_t key = block.key;
  blocks_.emplace(key, std::move(block));
  return true;
}

void PrefixCache::Evict(absl::node_hash_map<uint64_t, PrefixBlock>::iterator it) {
  MODSERVE_CHECK_EQ(it->second.num_children, 0);
  if (it->second.parent != 0) {
    auto parent = blocks_.find(it->second.parent);
    MODSERVE_CHECK(parent != blocks_.end());
    --parent->second.num_children;
  }
  for (const std::vector<PageId>& layer : it->second.pages) {
    pool_->Release(layer);
    num_pages_ -= static_cast<int32_t>(layer.size());
  }
  blocks_.erase(it);
}

bool PrefixCache::EvictUntilFree(int32_t num_free) {
  while (pool_->num_free() < num_free) {
    // The least recently used leaf. A linear scan: eviction happens only when the pool runs
    // dry, and then each victim frees up to n_layers pages.
    auto victim = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->second.num_children != 0) continue;
      if (victim == blocks_.end() || it->second.last_used < victim->second.last_used) victim = it;
    }
    if (victim == blocks_.end()) return false;
    Evict(victim);
  }
  return true;
}

void PrefixCache::Clear() {
  while (!blocks_.empty()) {
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      auto next = std::next(it);
      if (it->second.num_children == 0) Evict(it);
      it = next;
    }
  }
}

int32_t PrefixCache::NumReclaimablePages() const {
  int32_t n = 0;
  for (const auto& [key, block] : blocks_) {
    for (const std::vector<PageId>& layer : block.pages) {
      for (PageId p : layer) n += pool_->RefCount(p) == 1;
    }
  }
  return n;
}

}  // namespace modserve::engine
