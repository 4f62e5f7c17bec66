// Automatic prefix caching over the sparse per-layer KV cache: the KV entries of full token blocks
// that sequences computed, kept after those sequences end, so a later sequence with the same
// prefix (and the same routing threshold) starts from them. It keeps page references and
// bookkeeping only; KvCacheManager attaches cached pages to sequences and the backend copies
// pages (copy-on-write) when a sequence appends to a shared partial page.
#ifndef MODSERVE_ENGINE_KV_CACHE_PREFIX_CACHE_H_
#define MODSERVE_ENGINE_KV_CACHE_PREFIX_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/types/span.h"
#include "engine/kv_cache/block_pool.h"

namespace modserve::engine {

// One cached block: tokens [j * block_size, (j + 1) * block_size) of some sequence, after the
// chain of blocks before it (`parent`, 0 for the first block). Routing is causal, so the KV
// entries a prefix leaves at each layer are a function of the prefix (and the threshold, which
// the key's salt carries) alone.
//
// Per layer l the block records the state of the layer once the block is fed: num_entries[l]
// entries (every token at a dense layer, the routed-in ones at a routed layer), stored on the
// chain's page list. A dense layer's list grows by exactly the block's pages. A routed layer
// stores a variable number of entries per block, so its last page is often partial and shared
// with the next block's entries: the block holds references on the pages from index
// first_page[l] on, which replace the chain's pages from that index (first_page[l] is the
// parent's page count, or one less when the sequence that cached this block had copied the
// parent's partial last page before appending to it).
struct PrefixBlock {
  uint64_t key = 0;
  uint64_t parent = 0;
  uint64_t salt = 0;
  std::vector<int32_t> tokens;                  // [block_size]
  std::vector<int32_t> num_entries;             // [n_layers] entries once this block is fed
  std::vector<int32_t> first_page;              // [n_layers] index of pages[l][0] in the list
  std::vector<std::vector<PageId>> pages;       // [n_layers] pages this block references
  std::vector<PageId> tail_page;                // [n_layers] last page of the list, or -1
  std::vector<uint8_t> payload;                 // the caller's (routing decisions)
  int32_t num_children = 0;
  uint64_t last_used = 0;
};

// Thread contract: engine thread only (like the pool it references).
class PrefixCache {
 public:
  PrefixCache(int32_t block_size, int32_t n_layers, BlockPool* pool);
  ~PrefixCache();  // releases every page reference it holds
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The key of a block with these tokens after the block keyed `parent` (0: the first block).
  static uint64_t Key(uint64_t parent, absl::Span<const int32_t> tokens, uint64_t salt);

  // The longest chain of cached blocks whose tokens prefix `tokens` (full blocks only), first
  // block first; marks them used (LRU).
  std::vector<const PrefixBlock*> Match(absl::Span<const int32_t> tokens, uint64_t salt);
  const PrefixBlock* Find(uint64_t key) const;

  // The page list and entry count of every layer at the end of `chain` (non-empty).
  void ChainState(absl::Span<const PrefixBlock* const> chain,
                  std::vector<std::vector<PageId>>* pages, std::vector<int32_t>* counts) const;

  // Adds `block` (its key must be new; its parent cached or 0) and takes one reference on each
  // of its pages. Returns false, taking nothing, when the key is already cached or the parent
  // is not.
  bool Insert(PrefixBlock block);

  // Evicts least recently used blocks that no other cached block extends until the pool has
  // `num_free` free pages or nothing is left to evict. Returns whether the pool has them.
  bool EvictUntilFree(int32_t num_free);
  // Evicts everything.
  void Clear();

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Page references the cache holds, and how many of those pages nothing else references
  // (free for the taking: eviction returns them to the pool).
  int32_t num_pages() const { return num_pages_; }
  int32_t NumReclaimablePages() const;
  int32_t block_size() const { return block_size_; }

 private:
  void Evict(absl::node_hash_map<uint64_t, PrefixBlock>::iterator it);

  int32_t block_size_;
  int32_t n_layers_;
  BlockPool* pool_;
  absl::node_hash_map<uint64_t, PrefixBlock> blocks_;
  uint64_t clock_ = 0;
  int32_t num_pages_ = 0;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_KV_CACHE_PREFIX_CACHE_H_
