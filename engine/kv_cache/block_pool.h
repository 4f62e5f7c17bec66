// A fixed set of KV page ids with O(1) allocate/free and per-page refcounts.
// It hands out ids only: the page memory is the backend's, and prefix sharing is a future user.
#ifndef MODSERVE_ENGINE_KV_CACHE_BLOCK_POOL_H_
#define MODSERVE_ENGINE_KV_CACHE_BLOCK_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace modserve::engine {

// Index of one page in the pool tensor [num_pages, 2 * n_kv_heads, block_size, head_dim].
using PageId = int32_t;

// Page ids 0..num_pages-1. A free page has refcount 0; Allocate sets it to 1; IncRef/Release move
// it up and down; it returns to the free list when the count reaches 0.
// Free list order: FIFO (the least recently freed page is reused first), so a freed page keeps its
// contents as long as possible, which is what prefix caching will want.
// Thread contract: engine thread only; no internal locking.
// Releasing a free page (double free / refcount underflow) or touching an id outside the pool is
// a bug in our own bookkeeping and CHECK-fails.
class BlockPool {
 public:
  // num_pages >= 0 (CHECK: callers validate configuration first, see KvCacheManager::Create).
  explicit BlockPool(int32_t num_pages);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  BlockPool(BlockPool&&) = default;
  BlockPool& operator=(BlockPool&&) = default;

  // All-or-nothing: appends `count` fresh page ids (refcount 1) to `out`, or returns
  // ResourceExhausted ("needs N pages, M free") and changes neither the pool nor `out`.
  absl::Status Allocate(int32_t count, std::vector<PageId>* out);

  // Adds a reference to an allocated page (for sharing). CHECK: the page is allocated.
  void IncRef(PageId page);
  // Drops one reference; the page is free again when the count reaches 0.
  // CHECK: the page is allocated (refcount > 0): a double free is a bug.
  void Release(PageId page);
  void Release(absl::Span<const PageId> pages);

  int32_t RefCount(PageId page) const;
  int32_t num_pages() const { return static_cast<int32_t>(refcounts_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t num_used() const { return num_pages() - num_free_; }

 private:
  void CheckId(PageId page) const;

  // [num_pages] reference count per page; 0 = free.
  std::vector<int32_t> refcounts_;
  // Ring buffer of free page ids, capacity num_pages: pop at head_, push at (head_ + num_free_).
  std::vector<PageId> free_ring_;
  int32_t head_ = 0;
  int32_t num_free_ = 0;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_KV_CACHE_BLOCK_POOL_H_
