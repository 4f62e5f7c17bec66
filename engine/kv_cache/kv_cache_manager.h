// Per-sequence, per-layer paged KV bookkeeping for MoD models: reserves pages for the tokens a
// step writes at each layer, hands out their slots, and keeps exact page/byte/token accounting.
// It never touches KV memory (the backend owns the pool tensor) and makes no admission policy.
#ifndef MODSERVE_ENGINE_KV_CACHE_KV_CACHE_MANAGER_H_
#define MODSERVE_ENGINE_KV_CACHE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/dtype.h"
#include "engine/kv_cache/block_pool.h"
#include "engine/kv_cache/block_table.h"
#include "engine/kv_cache/prefix_cache.h"

namespace modserve::engine {

// The engine's id for a running sequence.
using SequenceId = int64_t;

// A page copy the backend must make before the step writes: `dst` becomes a private copy of the
// shared page `src` (copy-on-write of a cached partial page).
struct PageCopy {
  PageId src;
  PageId dst;
};

// Slots handed out for one sequence in one step, layer-major.
struct ReservedSlots {
  // [sum over layers of that layer's new tokens] int64 pool slot numbers; layer l's slots are
  // slots[layer_offsets[l], layer_offsets[l + 1]), in the order the tokens are to be stored.
  std::vector<int64_t> slots;
  // [n_layers + 1] prefix offsets into `slots`.
  std::vector<int32_t> layer_offsets;
  // Copies to make before any slot is written (in order).
  std::vector<PageCopy> copies;

  absl::Span<const int64_t> ForLayer(int32_t layer) const {
    return absl::MakeConstSpan(slots).subspan(
        static_cast<size_t>(layer_offsets[layer]),
        static_cast<size_t>(layer_offsets[layer + 1] - layer_offsets[layer]));
  }
};

// Usage of one sequence. Bytes = pages * bytes_per_page.
struct SequenceKvUsage {
  std::vector<int32_t> pages_per_layer;   // [n_layers]
  std::vector<int32_t> tokens_per_layer;  // [n_layers] entries stored (routed-in tokens)
  int32_t num_pages = 0;
  int64_t bytes = 0;
};

// Snapshot of the whole cache (for metrics and admission). Pages held by a capacity reservation
// that is not committed yet count as used; pages only the prefix cache references count as free
// (allocation evicts them).
struct KvCacheStats {
  int32_t num_pages = 0;
  int32_t block_size = 0;
  int32_t n_layers = 0;
  int64_t bytes_per_page = 0;
  int32_t num_sequences = 0;
  int32_t num_free_pages = 0;
  int32_t num_used_pages = 0;
  int64_t used_bytes = 0;
  int64_t capacity_bytes = 0;                 // num_pages * bytes_per_page
  std::vector<int32_t> used_pages_per_layer;  // [n_layers]
  std::vector<int64_t> used_bytes_per_layer;  // [n_layers]
  std::vector<int64_t> tokens_per_layer;      // [n_layers] entries stored over all sequences
  int32_t num_prefix_cache_blocks = 0;        // cached blocks (0 when prefix caching is off)
  int32_t num_prefix_cache_pages = 0;         // pages the prefix cache references
  int32_t num_referenced_pages = 0;  // pages out of the pool (sequences' and the cache's)
};

// Shared contract with the backend: one pool tensor
//   [num_pages, 2 * n_kv_heads, block_size, head_dim] in the KV dtype
// shared by all layers and sequences. Page p holds block_size entries of ONE (sequence, layer):
// K in rows [0, n_kv_heads), V in rows [n_kv_heads, 2 * n_kv_heads). A token whose slot is s
// goes to page s / block_size, offset s % block_size. Each (sequence, layer) has its own page
// list and entry count: a routed layer only stores tokens routed into it, dense layers store all.
//
// Two ways to write a step:
//  - Known counts (CPU path, tests): Reserve(seq, tokens_per_layer) or Append(seq, layer, n)
//    allocate and commit at once.
//  - Counts known only after the forward pass (MoD routing decided on the device, layer by
//    layer): ReserveCapacity(seq, max_tokens_per_layer) before the step returns the slots of
//    every candidate; the backend writes the j-th token routed in at layer l to that layer's
//    j-th slot; after the step Commit(seq, actual_tokens_per_layer) advances the counts and
//    returns the pages left unused to the pool.
//
// Status codes: NotFound (unknown sequence id: it may race with a cancellation), AlreadyExists
// (AddSequence twice), InvalidArgument (bad layer index, negative counts, vector size != n_layers,
// commit beyond reserved capacity), ResourceExhausted (not enough free pages; nothing changed).
// Thread contract: engine thread only; no internal locking. Spans returned by PageTable stay
// valid until the next call that changes that sequence.
class KvCacheManager {
 public:
  // InvalidArgument unless num_pages >= 0, block_size > 0, n_layers > 0, bytes_per_page > 0.
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(int32_t num_pages,
                                                                int32_t block_size,
                                                                int32_t n_layers,
                                                                int64_t bytes_per_page);
  // Bytes of one page: K and V of block_size tokens for one layer.
  static int64_t BytesPerPage(int32_t n_kv_heads, int32_t block_size, int32_t head_dim,
                              DType kv_dtype);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  absl::Status AddSequence(SequenceId seq_id);

  // Prefix caching (off until enabled): blocks of block_size tokens that sequences cached keep
  // their pages after the sequences end, until allocation needs the pages.
  void EnablePrefixCache();
  bool prefix_cache_enabled() const { return prefix_ != nullptr; }
  // Null when prefix caching is off.
  const PrefixCache* prefix_cache() const { return prefix_.get(); }
  // Drops every cached block (pages still attached to sequences stay with them).
  void ClearPrefixCache();
  // Attaches the longest cached prefix of `tokens` (full blocks, same `salt`) to `seq_id`, which
  // must hold no entries: its tables share the cached pages. Returns the chain attached (empty
  // when nothing matched); the caller reads each block's payload. FailedPrecondition when the
  // sequence holds entries or caching is off; NotFound for an unknown sequence.
  absl::StatusOr<std::vector<const PrefixBlock*>> AttachCachedPrefix(
      SequenceId seq_id, absl::Span<const int32_t> tokens, uint64_t salt);
  // Caches one more full block of `seq_id`: `tokens` (block_size of them) following the block
  // keyed `parent` (0: the first block), with counts[l] entries at layer l once it is fed (the
  // sequence holds at least as many) and the caller's payload. Returns the block's key, or 0
  // when it was not cached (the key is cached already, by another sequence's identical prefix,
  // or the parent was evicted): the caller then stops caching this sequence.
  absl::StatusOr<uint64_t> CacheBlock(SequenceId seq_id, uint64_t parent,
                                      absl::Span<const int32_t> tokens, uint64_t salt,
                                      absl::Span<const int32_t> counts,
                                      std::vector<uint8_t> payload);
  bool HasSequence(SequenceId seq_id) const { return sequences_.contains(seq_id); }
  // Returns every page of the sequence to the pool and forgets it (finish, cancel, preempt).
  absl::Status Free(SequenceId seq_id);

  // New pages the sequence would need to store tokens_per_layer[l] more entries at each layer.
  absl::StatusOr<int32_t> PagesNeeded(SequenceId seq_id,
                                      absl::Span<const int32_t> tokens_per_layer) const;
  // The same for a sequence not added yet: sum over layers of ceil(tokens / block_size).
  absl::StatusOr<int32_t> PagesNeededForNew(absl::Span<const int32_t> tokens_per_layer) const;

  // Stores num_tokens more entries at one layer; returns their slots in order.
  absl::StatusOr<std::vector<int64_t>> Append(SequenceId seq_id, int32_t layer, int32_t num_tokens);
  // All layers at once, all-or-nothing: checks the total page need against the free pages first.
  absl::StatusOr<ReservedSlots> Reserve(SequenceId seq_id,
                                        absl::Span<const int32_t> tokens_per_layer);
  // Like Reserve, but entry counts do not move: the returned slots are those of entries
  // num_tokens .. num_tokens + max_tokens_per_layer[l] - 1 at each layer.
  absl::StatusOr<ReservedSlots> ReserveCapacity(SequenceId seq_id,
                                                absl::Span<const int32_t> max_tokens_per_layer);
  // Advances entry counts by tokens_per_layer (each must fit the reserved capacity, checked for
  // all layers before anything changes) and returns pages beyond ceil(tokens / block_size).
  absl::Status Commit(SequenceId seq_id, absl::Span<const int32_t> tokens_per_layer);

  // Rollback (speculative decoding): keeps the first num_tokens_per_layer[l] entries of each
  // layer (at a routed layer: the first routed-in tokens) and returns pages that hold none of
  // them to the pool. A page the prefix cache or another sequence shares is never modified: a
  // kept partial page whose later entries others read is copied before the next append.
  // InvalidArgument when a count exceeds the layer's entries (nothing changes).
  absl::Status Truncate(SequenceId seq_id, absl::Span<const int32_t> num_tokens_per_layer);

  absl::StatusOr<absl::Span<const PageId>> PageTable(SequenceId seq_id, int32_t layer) const;
  absl::StatusOr<int32_t> NumTokens(SequenceId seq_id, int32_t layer) const;
  absl::StatusOr<SequenceKvUsage> Usage(SequenceId seq_id) const;
  KvCacheStats GetStats() const;

  // Free pages, counting those only the prefix cache references.
  int32_t num_free_pages() const;
  int32_t block_size() const { return block_size_; }
  int32_t n_layers() const { return n_layers_; }
  int64_t bytes_per_page() const { return bytes_per_page_; }

 private:
  KvCacheManager(int32_t num_pages, int32_t block_size, int32_t n_layers, int64_t bytes_per_page);

  absl::StatusOr<std::vector<BlockTable>*> FindTables(SequenceId seq_id);
  absl::StatusOr<const std::vector<BlockTable>*> FindTables(SequenceId seq_id) const;
  absl::Status CheckLayer(int32_t layer) const;
  absl::Status CheckCounts(absl::Span<const int32_t> tokens_per_layer) const;
  // All-or-nothing page growth so that tokens_per_layer[l] more entries fit at each layer.
  // Copies a shared partial tail page (copy-on-write) for every layer that appends to one.
  absl::Status Grow(SequenceId seq_id, std::vector<BlockTable>& tables,
                    absl::Span<const int32_t> tokens_per_layer, std::vector<PageCopy>* copies);
  void ReleaseFromLayer(int32_t layer, const std::vector<PageId>& pages);

  const int32_t block_size_;
  const int32_t n_layers_;
  const int64_t bytes_per_page_;
  BlockPool pool_;
  // Per sequence: [n_layers] block tables.
  absl::flat_hash_map<SequenceId, std::vector<BlockTable>> sequences_;
  std::vector<int32_t> used_pages_per_layer_;  // [n_layers] page references of sequences
  std::vector<int64_t> tokens_per_layer_;      // [n_layers]
  std::unique_ptr<PrefixCache> prefix_;        // null when prefix caching is off
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_KV_CACHE_KV_CACHE_MANAGER_H_
