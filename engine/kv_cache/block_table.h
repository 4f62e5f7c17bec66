// The page list and token count of one (sequence, layer), and the slot number of each entry.
// It holds page ids only; the pool owns their lifetimes and the backend owns their memory.
#ifndef MODSERVE_ENGINE_KV_CACHE_BLOCK_TABLE_H_
#define MODSERVE_ENGINE_KV_CACHE_BLOCK_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/kv_cache/block_pool.h"

namespace modserve::engine {

// Entry i (the i-th token stored at this (sequence, layer), in position order) lives on page
// pages()[i / block_size] at offset i % block_size, i.e. in pool slot
//   slot = pages()[i / block_size] * block_size + i % block_size,
// which indexes the pool tensor viewed as [num_pages * block_size] token slots per K/V half.
// In a routed layer entry i is the i-th token *routed into* that layer, not position i.
// Pages beyond ceil(num_tokens / block_size) may be held briefly between a capacity reservation
// and its commit (KvCacheManager::ReserveCapacity / Commit).
// Thread contract: engine thread only. Misuse (tokens beyond capacity) is a bug: CHECK.
class BlockTable {
 public:
  explicit BlockTable(int32_t block_size);

  int32_t block_size() const { return block_size_; }
  int32_t num_tokens() const { return num_tokens_; }
  int32_t num_pages() const { return static_cast<int32_t>(pages_.size()); }
  int32_t capacity() const { return num_pages() * block_size_; }
  absl::Span<const PageId> pages() const { return pages_; }

  // Pages to add so that `num_new_tokens` more entries fit after num_tokens().
  // 64-bit: num_tokens() + num_new_tokens may not fit 32 bits for a hostile request size.
  int64_t PagesNeeded(int32_t num_new_tokens) const;
  // Appends freshly allocated pages; the table owns its tail page afterwards.
  void AddPages(absl::Span<const PageId> pages);
  // Starts the table as a copy of a cached prefix: `pages` (shared with the prefix cache and
  // perhaps other sequences) holding `num_tokens` entries. Precondition: the table is empty.
  // A shared tail page is not the table's to append to (owns_tail() false).
  void Attach(absl::Span<const PageId> pages, int32_t num_tokens);
  // Whether entries may be appended to the last page in place. False for a tail page attached
  // from the prefix cache: the first append then copies it (KvCacheManager's copy-on-write).
  bool owns_tail() const {
    return !pages_.empty() && static_cast<int32_t>(pages_.size()) - 1 >= owned_from_;
  }
  // Replaces the last page by `page` (a private copy of it); the table owns the tail after.
  void ReplaceTail(PageId page);
  // Advances num_tokens(). CHECK: the result fits capacity().
  void AddTokens(int32_t num_new_tokens);
  // CHECK: 0 <= entry_idx < capacity().
  int64_t Slot(int32_t entry_idx) const;
  // Moves pages not needed for num_tokens() into `released` (in table order).
  void TrimTo(std::vector<PageId>* released);
  // Moves every page into `released` and resets num_tokens() to 0.
  void Clear(std::vector<PageId>* released);
  // Records that entries [0, num_entries) may be read by others (a cached prefix block made
  // from this table, or the cached chain it was attached from): Truncate never lets a later
  // append overwrite them in place.
  void Publish(int32_t num_entries);
  int32_t num_published() const { return num_published_; }
  // Rollback: keeps the first `num_tokens` entries (CHECK: <= num_tokens()) and moves the pages
  // they do not need into `released`. When the kept tail page is partial and holds published
  // entries past `num_tokens`, the table stops owning it, so the next append copies it first
  // (copy-on-write) instead of overwriting entries another reader sees.
  void Truncate(int32_t num_tokens, std::vector<PageId>* released);

 private:
  int32_t block_size_;
  int32_t num_tokens_ = 0;
  std::vector<PageId> pages_;
  // Pages at indices >= owned_from_ were allocated (or copied) for this table; those before it
  // came from the prefix cache and are read-only here.
  int32_t owned_from_ = 0;
  // Entries [0, num_published_) are visible to readers other than this table.
  int32_t num_published_ = 0;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_KV_CACHE_BLOCK_TABLE_H_
