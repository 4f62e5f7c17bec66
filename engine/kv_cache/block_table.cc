// BlockTable: page arithmetic for one (sequence, layer); allocation policy lives in the manager.
#include "engine/kv_cache/block_table.h"

#include <algorithm>

#include "engine/common/logging.h"

namespace modserve::engine {

BlockTable::BlockTable(int32_t block_size) : block_size_(block_size) {
  MODSERVE_CHECK(block_size > 0) << "block_size=" << block_size;
}

int64_t BlockTable::PagesNeeded(int32_t num_new_tokens) const {
  MODSERVE_CHECK(num_new_tokens >= 0) << "num_new_tokens=" << num_new_tokens;
  const int64_t total = int64_t{num_tokens_} + num_new_tokens;
  const int64_t pages = (total + block_size_ - 1) / block_size_;
  return pages <= num_pages() ? 0 : pages - num_pages();
}

void BlockTable::AddPages(absl::Span<const PageId> pages) {
  pages_.insert(pages_.end(), pages.begin(), pages.end());
}

void BlockTable::Attach(absl::Span<const PageId> pages, int32_t num_tokens) {
  MODSERVE_CHECK(pages_.empty() && num_tokens_ == 0) << "Attach to a table in use";
  MODSERVE_CHECK(num_tokens >= 0 &&
                 (num_tokens + block_size_ - 1) / block_size_ == static_cast<int32_t>(pages.size()))
      << num_tokens << " entries on " << pages.size() << " pages";
  pages_.assign(pages.begin(), pages.end());
  num_tokens_ = num_tokens;
  owned_from_ = static_cast<int32_t>(pages_.size());
  num_published_ = num_tokens;
}

void BlockTable::ReplaceTail(PageId page) {
  MODSERVE_CHECK(!pages_.empty());
  pages_.back() = page;
  owned_from_ = std::min(owned_from_, static_cast<int32_t>(pages_.size()) - 1);
}

void BlockTable::AddTokens(int32_t num_new_tokens) {
  MODSERVE_CHECK(num_new_tokens >= 0) << "num_new_tokens=" << num_new_tokens;
  MODSERVE_CHECK_LE(int64_t{num_tokens_} + num_new_tokens, int64_t{capacity()});
  num_tokens_ += num_new_tokens;
}

int64_t BlockTable::Slot(int32_t entry_idx) const {
  MODSERVE_CHECK(entry_idx >= 0 && entry_idx < capacity())
      << "entry " << entry_idx << " outside capacity " << capacity();
  return int64_t{pages_[entry_idx / block_size_]} * block_size_ + entry_idx % block_size_;
}

void BlockTable::TrimTo(std::vector<PageId>* released) {
  const size_t keep = static_cast<size_t>((num_tokens_ + block_size_ - 1) / block_size_);
  if (pages_.size() <= keep) return;
  released->insert(released->end(), pages_.begin() + static_cast<ptrdiff_t>(keep), pages_.end());
  pages_.resize(keep);
  owned_from_ = std::min(owned_from_, static_cast<int32_t>(keep));
}

void BlockTable::Clear(std::vector<PageId>* released) {
  released->insert(released->end(), pages_.begin(), pages_.end());
  pages_.clear();
  num_tokens_ = 0;
  owned_from_ = 0;
  num_published_ = 0;
}

void BlockTable::Publish(int32_t num_entries) {
  MODSERVE_CHECK(num_entries >= 0 && num_entries <= num_tokens_)
      << "publish " << num_entries << " of " << num_tokens_ << " entries";
  num_published_ = std::max(num_published_, num_entries);
}

void BlockTable::Truncate(int32_t num_tokens, std::vector<PageId>* released) {
  MODSERVE_CHECK(num_tokens >= 0 && num_tokens <= num_tokens_)
      << "truncate to " << num_tokens << " of " << num_tokens_ << " entries";
  num_tokens_ = num_tokens;
  TrimTo(released);
  // Appending in place at entry num_tokens would overwrite published entries that share the
  // tail page: give the page up for writing (the next append copies it).
  // Only the tail's ownership is ever read, so marking every page unowned is enough.
  if (num_tokens % block_size_ != 0 && num_tokens < num_published_) {
    owned_from_ = static_cast<int32_t>(pages_.size());
  }
}

}  // namespace modserve::engine
