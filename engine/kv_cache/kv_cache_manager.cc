// KvCacheManager: validation first, then all-or-nothing page moves, with counters kept
// incrementally so that GetStats() is O(n_layers) rather than a walk over every sequence.
#include "engine/kv_cache/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"

namespace modserve::engine {

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(int32_t num_pages,
                                                                       int32_t block_size,
                                                                       int32_t n_layers,
                                                                       int64_t bytes_per_page) {
  if (num_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: num_pages=", num_pages, " must be >= 0"));
  }
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: block_size=", block_size, " must be > 0"));
  }
  if (n_layers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: n_layers=", n_layers, " must be > 0"));
  }
  if (bytes_per_page <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: bytes_per_page=", bytes_per_page, " must be > 0"));
  }
  // Slots are int64 but the backend may index a page's rows in int32: keep page * block_size sane.
  if (int64_t{num_pages} * block_size > int64_t{INT32_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: num_pages * block_size = ", int64_t{num_pages} * block_size,
                     " slots exceeds ", INT32_MAX));
  }
  return std::unique_ptr<KvCacheManager>(
      new KvCacheManager(num_pages, block_size, n_layers, bytes_per_page));
}

int64_t KvCacheManager::BytesPerPage(int32_t n_kv_heads, int32_t block_size, int32_t head_dim,
                                     DType kv_dtype) {
  return int64_t{2} * n_kv_heads * block_size * head_dim *
         static_cast<int64_t>(DTypeBytes(kv_dtype));
}

KvCacheManager::KvCacheManager(int32_t num_pages, int32_t block_size, int32_t n_layers,
                               int64_t bytes_per_page)
    : block_size_(block_size),
      n_layers_(n_layers),
      bytes_per_page_(bytes_per_page),
      pool_(num_pages),
      used_pages_per_layer_(static_cast<size_t>(n_layers), 0),
      tokens_per_layer_(static_cast<size_t>(n_layers), 0) {}

absl::Status KvCacheManager::AddSequence(SequenceId seq_id) {
  auto [it, inserted] = sequences_.try_emplace(seq_id);
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("KV cache: sequence ", seq_id, " already added"));
  }
  it->second.assign(static_cast<size_t>(n_layers_), BlockTable(block_size_));
  return absl::OkStatus();
}

absl::Status KvCacheManager::Free(SequenceId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache: unknown sequence ", seq_id));
  }
  std::vector<PageId> released;
  for (int32_t l = 0; l < n_layers_; ++l) {
    BlockTable& table = it->second[l];
    tokens_per_layer_[l] -= table.num_tokens();
    released.clear();
    table.Clear(&released);
    ReleaseFromLayer(l, released);
  }
  sequences_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> KvCacheManager::PagesNeeded(
    SequenceId seq_id, absl::Span<const int32_t> tokens_per_layer) const {
  MODSERVE_ASSIGN_OR_RETURN(const std::vector<BlockTable>* tables, FindTables(seq_id));
  MODSERVE_RETURN_IF_ERROR(CheckCounts(tokens_per_layer));
  int64_t total = 0;
  for (int32_t l = 0; l < n_layers_; ++l) total += (*tables)[l].PagesNeeded(tokens_per_layer[l]);
  // Capped, since a request-sized count could exceed int32; anything above the pool is "too many".
  return static_cast<int32_t>(std::min<int64_t>(total, INT32_MAX));
}

absl::StatusOr<int32_t> KvCacheManager::PagesNeededForNew(
    absl::Span<const int32_t> tokens_per_layer) const {
  MODSERVE_RETURN_IF_ERROR(CheckCounts(tokens_per_layer));
  int64_t total = 0;
  for (int32_t tokens : tokens_per_layer)
    total += (int64_t{tokens} + block_size_ - 1) / block_size_;
  return static_cast<int32_t>(std::min<int64_t>(total, INT32_MAX));
}

absl::StatusOr<std::vector<int64_t>> KvCacheManager::Append(SequenceId seq_id, int32_t layer,
                                                            int32_t num_tokens) {
  MODSERVE_RETURN_IF_ERROR(CheckLayer(layer));
  std::vector<int32_t> counts(static_cast<size_t>(n_layers_), 0);
  counts[layer] = num_tokens;
  MODSERVE_ASSIGN_OR_RETURN(ReservedSlots reserved, Reserve(seq_id, counts));
  return std::move(reserved.slots);
}

absl::StatusOr<ReservedSlots> KvCacheManager::Reserve(SequenceId seq_id,
                                                      absl::Span<const int32_t> tokens_per_layer) {
  MODSERVE_ASSIGN_OR_RETURN(ReservedSlots reserved, ReserveCapacity(seq_id, tokens_per_layer));
  // ReserveCapacity validated the sequence and counts, and the capacity now fits them.
  std::vector<BlockTable>& tables = *FindTables(seq_id).value();
  for (int32_t l = 0; l < n_layers_; ++l) {
    tables[l].AddTokens(tokens_per_layer[l]);
    tokens_per_layer_[l] += tokens_per_layer[l];
  }
  return reserved;
}

absl::StatusOr<ReservedSlots> KvCacheManager::ReserveCapacity(
    SequenceId seq_id, absl::Span<const int32_t> max_tokens_per_layer) {
  MODSERVE_ASSIGN_OR_RETURN(std::vector<BlockTable> * tables, FindTables(seq_id));
  MODSERVE_RETURN_IF_ERROR(CheckCounts(max_tokens_per_layer));
  ReservedSlots reserved;
  MODSERVE_RETURN_IF_ERROR(Grow(seq_id, *tables, max_tokens_per_layer, &reserved.copies));
  reserved.layer_offsets.reserve(static_cast<size_t>(n_layers_) + 1);
  reserved.layer_offsets.push_back(0);
  int64_t total = 0;
  for (int32_t n : max_tokens_per_layer) total += n;
  reserved.slots.reserve(static_cast<size_t>(total));
  for (int32_t l = 0; l < n_layers_; ++l) {
    const BlockTable& table = (*tables)[l];
    for (int32_t i = 0; i < max_tokens_per_layer[l]; ++i) {
      reserved.slots.push_back(table.Slot(table.num_tokens() + i));
    }
    reserved.layer_offsets.push_back(static_cast<int32_t>(reserved.slots.size()));
  }
  return reserved;
}

absl::Status KvCacheManager::Commit(SequenceId seq_id, absl::Span<const int32_t> tokens_per_layer) {
  MODSERVE_ASSIGN_OR_RETURN(std::vector<BlockTable> * tables, FindTables(seq_id));
  MODSERVE_RETURN_IF_ERROR(CheckCounts(tokens_per_layer));
  for (int32_t l = 0; l < n_layers_; ++l) {
    const BlockTable& table = (*tables)[l];
    if (int64_t{table.num_tokens()} + tokens_per_layer[l] > table.capacity()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache: commit of ", tokens_per_layer[l], " entries at layer ", l, " of sequence ",
          seq_id, " exceeds reserved capacity ", table.capacity() - table.num_tokens()));
    }
  }
  std::vector<PageId> released;
  for (int32_t l = 0; l < n_layers_; ++l) {
    BlockTable& table = (*tables)[l];
    table.AddTokens(tokens_per_layer[l]);
    tokens_per_layer_[l] += tokens_per_layer[l];
    released.clear();
    table.TrimTo(&released);
    ReleaseFromLayer(l, released);
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::Truncate(SequenceId seq_id,
                                      absl::Span<const int32_t> num_tokens_per_layer) {
  MODSERVE_ASSIGN_OR_RETURN(std::vector<BlockTable> * tables, FindTables(seq_id));
  MODSERVE_RETURN_IF_ERROR(CheckCounts(num_tokens_per_layer));
  for (int32_t l = 0; l < n_layers_; ++l) {
    if (num_tokens_per_layer[l] > (*tables)[l].num_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache: truncating layer ", l, " of sequence ", seq_id, " to ",
          num_tokens_per_layer[l], " entries; it holds ", (*tables)[l].num_tokens()));
    }
  }
  std::vector<PageId> released;
  for (int32_t l = 0; l < n_layers_; ++l) {
    BlockTable& table = (*tables)[l];
    tokens_per_layer_[l] -= table.num_tokens() - num_tokens_per_layer[l];
    released.clear();
    table.Truncate(num_tokens_per_layer[l], &released);
    ReleaseFromLayer(l, released);
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const PageId>> KvCacheManager::PageTable(SequenceId seq_id,
                                                                   int32_t layer) const {
  MODSERVE_ASSIGN_OR_RETURN(const std::vector<BlockTable>* tables, FindTables(seq_id));
  MODSERVE_RETURN_IF_ERROR(CheckLayer(layer));
  return (*tables)[layer].pages();
}

absl::StatusOr<int32_t> KvCacheManager::NumTokens(SequenceId seq_id, int32_t layer) const {
  MODSERVE_ASSIGN_OR_RETURN(const std::vector<BlockTable>* tables, FindTables(seq_id));
  MODSERVE_RETURN_IF_ERROR(CheckLayer(layer));
  return (*tables)[layer].num_tokens();
}

absl::StatusOr<SequenceKvUsage> KvCacheManager::Usage(SequenceId seq_id) const {
  MODSERVE_ASSIGN_OR_RETURN(const std::vector<BlockTable>* tables, FindTables(seq_id));
  SequenceKvUsage usage;
  for (const BlockTable& table : *tables) {
    usage.pages_per_layer.push_back(table.num_pages());
    usage.tokens_per_layer.push_back(table.num_tokens());
    usage.num_pages += table.num_pages();
  }
  usage.bytes = int64_t{usage.num_pages} * bytes_per_page_;
  return usage;
}

KvCacheStats KvCacheManager::GetStats() const {
  KvCacheStats stats;
  stats.num_pages = pool_.num_pages();
  stats.block_size = block_size_;
  stats.n_layers = n_layers_;
  stats.bytes_per_page = bytes_per_page_;
  stats.num_sequences = static_cast<int32_t>(sequences_.size());
  stats.num_free_pages = num_free_pages();
  stats.num_used_pages = stats.num_pages - stats.num_free_pages;
  stats.used_bytes = int64_t{stats.num_used_pages} * bytes_per_page_;
  stats.capacity_bytes = int64_t{stats.num_pages} * bytes_per_page_;
  stats.used_pages_per_layer = used_pages_per_layer_;
  for (int32_t pages : used_pages_per_layer_) {
    stats.used_bytes_per_layer.push_back(int64_t{pages} * bytes_per_page_);
  }
  stats.tokens_per_layer = tokens_per_layer_;
  stats.num_referenced_pages = pool_.num_used();
  if (prefix_ != nullptr) {
    stats.num_prefix_cache_blocks = prefix_->num_blocks();
    stats.num_prefix_cache_pages = prefix_->num_pages();
  }
  return stats;
}

absl::StatusOr<std::vector<BlockTable>*> KvCacheManager::FindTables(SequenceId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache: unknown sequence ", seq_id));
  }
  return &it->second;
}

absl::StatusOr<const std::vector<BlockTable>*> KvCacheManager::FindTables(SequenceId seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache: unknown sequence ", seq_id));
  }
  return &it->second;
}

absl::Status KvCacheManager::CheckLayer(int32_t layer) const {
  if (layer < 0 || layer >= n_layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: layer ", layer, " outside [0, ", n_layers_, ")"));
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::CheckCounts(absl::Span<const int32_t> tokens_per_layer) const {
  if (static_cast<int64_t>(tokens_per_layer.size()) != n_layers_) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: tokens_per_layer has ",
                                                   tokens_per_layer.size(),
                                                   " entries, n_layers=", n_layers_));
  }
  for (int32_t l = 0; l < n_layers_; ++l) {
    if (tokens_per_layer[l] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("KV cache: tokens_per_layer[", l,
                                                     "]=", tokens_per_layer[l], " must be >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::Grow(SequenceId seq_id, std::vector<BlockTable>& tables,
                                  absl::Span<const int32_t> tokens_per_layer,
                                  std::vector<PageCopy>* copies) {
  // A layer that appends to a partial tail page it does not own (attached from the prefix
  // cache) first needs a private copy of that page.
  auto needs_copy = [&](int32_t l) {
    const BlockTable& t = tables[l];
    return tokens_per_layer[l] > 0 && t.num_tokens() % block_size_ != 0 && !t.owns_tail();
  };
  int64_t needed = 0;
  for (int32_t l = 0; l < n_layers_; ++l) {
    needed += tables[l].PagesNeeded(tokens_per_layer[l]) + (needs_copy(l) ? 1 : 0);
  }
  if (needed > pool_.num_free() && prefix_ != nullptr && needed <= num_free_pages()) {
    prefix_->EvictUntilFree(static_cast<int32_t>(needed));
  }
  if (needed > pool_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: sequence ", seq_id, " needs ",
                                                     needed, " pages, ", num_free_pages(),
                                                     " free of ", pool_.num_pages()));
  }
  std::vector<PageId> pages;
  MODSERVE_CHECK(pool_.Allocate(static_cast<int32_t>(needed), &pages).ok());
  size_t next = 0;
  for (int32_t l = 0; l < n_layers_; ++l) {
    if (needs_copy(l)) {
      const PageId shared = tables[l].pages().back();
      const PageId own = pages[next++];
      copies->push_back({shared, own});
      tables[l].ReplaceTail(own);
      // The cache (and perhaps other sequences) keep the shared page; this reference moves to
      // the copy. The copy is made before the step writes anything, so `shared` cannot be
      // reallocated and overwritten before it is read.
      pool_.Release(shared);
    }
    const int32_t n = static_cast<int32_t>(tables[l].PagesNeeded(tokens_per_layer[l]));
    tables[l].AddPages(absl::MakeConstSpan(pages).subspan(next, static_cast<size_t>(n)));
    used_pages_per_layer_[l] += n;
    next += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void KvCacheManager::EnablePrefixCache() {
  if (prefix_ == nullptr) prefix_ = std::make_unique<PrefixCache>(block_size_, n_layers_, &pool_);
}

void KvCacheManager::ClearPrefixCache() {
  if (prefix_ != nullptr) prefix_->Clear();
}

int32_t KvCacheManager::num_free_pages() const {
  return pool_.num_free() + (prefix_ != nullptr ? prefix_->NumReclaimablePages() : 0);
}

absl::StatusOr<std::vector<const PrefixBlock*>> KvCacheManager::AttachCachedPrefix(
    SequenceId seq_id, absl::Span<const int32_t> tokens, uint64_t salt) {
  MODSERVE_ASSIGN_OR_RETURN(std::vector<BlockTable> * tables, FindTables(seq_id));
  if (prefix_ == nullptr) return absl::FailedPreconditionError("KV cache: prefix caching is off");
  for (const BlockTable& t : *tables) {
    if (t.num_pages() != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV cache: sequence ", seq_id, " already holds entries"));
    }
  }
  std::vector<const PrefixBlock*> chain = prefix_->Match(tokens, salt);
  if (chain.empty()) return chain;
  std::vector<std::vector<PageId>> pages;
  std::vector<int32_t> counts;
  prefix_->ChainState(chain, &pages, &counts);
  for (int32_t l = 0; l < n_layers_; ++l) {
    for (PageId p : pages[l]) pool_.IncRef(p);
    (*tables)[l].Attach(pages[l], counts[l]);
    used_pages_per_layer_[l] += static_cast<int32_t>(pages[l].size());
    tokens_per_layer_[l] += counts[l];
  }
  return chain;
}

absl::StatusOr<uint64_t> KvCacheManager::CacheBlock(SequenceId seq_id, uint64_t parent,
                                                    absl::Span<const int32_t> tokens,
                                                    uint64_t salt,
                                                    absl::Span<const int32_t> counts,
                                                    std::vector<uint8_t> payload) {
  MODSERVE_ASSIGN_OR_RETURN(std::vector<BlockTable> * tables, FindTables(seq_id));
  if (prefix_ == nullptr) return absl::FailedPreconditionError("KV cache: prefix caching is off");
  MODSERVE_RETURN_IF_ERROR(CheckCounts(counts));
  if (static_cast<int32_t>(tokens.size()) != block_size_) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: a cached block has ", block_size_,
                                                   " tokens, got ", tokens.size()));
  }
  const PrefixBlock* up = parent == 0 ? nullptr : prefix_->Find(parent);
  if (parent != 0 && up == nullptr) return uint64_t{0};
  PrefixBlock block;
  block.key = PrefixCache::Key(parent, tokens, salt);
  if (prefix_->Find(block.key) != nullptr) return uint64_t{0};
  block.parent = parent;
  block.salt = salt;
  block.tokens.assign(tokens.begin(), tokens.end());
  block.num_entries.assign(counts.begin(), counts.end());
  block.payload = std::move(payload);
  block.first_page.resize(static_cast<size_t>(n_layers_));
  block.pages.resize(static_cast<size_t>(n_layers_));
  block.tail_page.resize(static_cast<size_t>(n_layers_));
  for (int32_t l = 0; l < n_layers_; ++l) {
    const BlockTable& t = (*tables)[l];
    const int32_t before = up == nullptr ? 0 : up->num_entries[l];
    if (counts[l] < before || counts[l] > t.num_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache: block of sequence ", seq_id, " at layer ", l, " ends at ", counts[l],
          " entries; the parent ends at ", before, " and the sequence holds ", t.num_tokens()));
    }
    const int32_t parent_pages = (before + block_size_ - 1) / block_size_;
    const int32_t pages = (counts[l] + block_size_ - 1) / block_size_;
    // The parent's partial last page, if this sequence holds its own copy of it (it appended to
    // it after attaching), is replaced by that copy.
    int32_t first = parent_pages;
    if (before % block_size_ != 0 && t.pages()[parent_pages - 1] != up->tail_page[l]) {
      first = parent_pages - 1;
    }
    block.first_page[l] = first;
    block.pages[l].assign(t.pages().begin() + first, t.pages().begin() + pages);
    block.tail_page[l] = pages > 0 ? t.pages()[pages - 1] : -1;
  }
  const uint64_t key = block.key;
  if (!prefix_->Insert(std::move(block))) return uint64_t{0};
  for (int32_t l = 0; l < n_layers_; ++l) (*tables)[l].Publish(counts[l]);
  return key;
}

void KvCacheManager::ReleaseFromLayer(int32_t layer, const std::vector<PageId>& pages) {
  pool_.Release(pages);
  used_pages_per_layer_[layer] -= static_cast<int32_t>(pages.size());
}

}  // namespace modserve::engine
