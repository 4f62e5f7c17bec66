// BlockPool: a ring-buffer free list plus refcounts; no allocation after construction.
#include "engine/kv_cache/block_pool.h"

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"

namespace modserve::engine {

BlockPool::BlockPool(int32_t num_pages)
    : refcounts_(static_cast<size_t>(num_pages), 0),
      free_ring_(static_cast<size_t>(num_pages)),
      num_free_(num_pages) {
  MODSERVE_CHECK(num_pages >= 0) << "num_pages=" << num_pages;
  for (int32_t p = 0; p < num_pages; ++p) free_ring_[p] = p;
}

absl::Status BlockPool::Allocate(int32_t count, std::vector<PageId>* out) {
  MODSERVE_CHECK(count >= 0) << "count=" << count;
  if (count > num_free_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: needs ", count, " pages, ", num_free_, " free of ", num_pages()));
  }
  const int32_t n = num_pages();
  out->reserve(out->size() + static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    const PageId page = free_ring_[head_];
    head_ = head_ + 1 == n ? 0 : head_ + 1;
    MODSERVE_CHECK_EQ(refcounts_[page], 0) << "page " << page << " on the free list is in use";
    refcounts_[page] = 1;
    out->push_back(page);
  }
  num_free_ -= count;
  return absl::OkStatus();
}

void BlockPool::IncRef(PageId page) {
  CheckId(page);
  MODSERVE_CHECK(refcounts_[page] > 0) << "IncRef on free page " << page;
  ++refcounts_[page];
}

void BlockPool::Release(PageId page) {
  CheckId(page);
  MODSERVE_CHECK(refcounts_[page] > 0) << "double free / refcount underflow of page " << page;
  if (--refcounts_[page] > 0) return;
  // num_free_ < num_pages here because this page was in use, so the tail slot is vacant.
  const int32_t n = num_pages();
  int32_t tail = head_ + num_free_;
  if (tail >= n) tail -= n;
  free_ring_[tail] = page;
  ++num_free_;
}

void BlockPool::Release(absl::Span<const PageId> pages) {
  for (PageId page : pages) Release(page);
}

int32_t BlockPool::RefCount(PageId page) const {
  CheckId(page);
  return refcounts_[page];
}

void BlockPool::CheckId(PageId page) const {
  MODSERVE_CHECK(page >= 0 && page < num_pages())
      << "page id " << page << " outside pool of " << num_pages();
}

}  // namespace modserve::engine
