// The core both byte-level BPE front ends share (tokenizer.json in bpe_tokenizer.cc, GGUF
// metadata in gguf_tokenizer.cc): GPT-2's byte alphabet and the merge loop over one pre-token.
// It knows nothing of added tokens, normalizers, pre-tokenizer regexes or post-processing.
#ifndef MODSERVE_ENGINE_TOKENIZER_BPE_MODEL_H_
#define MODSERVE_ENGINE_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace modserve::engine::internal {

// The raw bytes a byte-level spelling ("Ġthe") stands for, or nullopt when a character of
// `token` is outside GPT-2's 256-character byte alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view token);
// The byte-level spelling of `bytes` (the inverse of ByteLevelToBytes).
std::string BytesToByteLevel(std::string_view bytes);

// Decodes one character of well-formed UTF-8 at `*pos`, advancing it.
char32_t NextCodePoint(std::string_view s, size_t* pos);

// Abseil here is built with its own string_view, so lookups by std::string_view need these.
struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
struct StringViewEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
using StringToId = absl::flat_hash_map<std::string, int32_t, StringViewHash, StringViewEq>;

// How BpeModel::Create treats merges and repeated pairs; the two front ends follow their
// reference implementations, which differ here.
struct BpeModelOptions {
  // Words whose bytes spell a token are that token, whatever the merges say (Llama 3).
  bool ignore_merges = false;
  // Bytes with no single-byte token become this token; without one they are dropped.
  std::optional<int32_t> unk_id;
  // A pair listed twice keeps its first rank (llama.cpp) instead of its last (`tokenizers`).
  bool first_rank_wins = false;
  // false (`tokenizers`): every merge's parts and result must be tokens, else Create fails.
  // true (llama.cpp): merges are applied by spelling; a result that is no token still merges
  // on, and a final piece that is no token is emitted as the single-byte tokens of its spelling's
  // UTF-8 bytes (those that exist); a merge whose parts can never form is ignored.
  bool merges_by_spelling = false;
};

// Immutable after Create; every method is const and safe to call from any number of threads.
class BpeModel {
 public:
  // `tokens`: (byte-level spelling, id) of every token the merges may produce, in id order; a
  // spelling given twice means its last id. `merges`: (left, right) spellings in rank order.
  // InvalidArgument (strict merges only): "merge #N 'left right': a part or the result is not a
  // token"; the caller adds where the merges came from.
  static absl::StatusOr<BpeModel> Create(
      absl::Span<const std::pair<std::string_view, int32_t>> tokens,
      absl::Span<const std::pair<std::string_view, std::string_view>> merges,
      const BpeModelOptions& options);

  // Appends the ids of one pre-token given as raw bytes.
  void EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const;

  // The token whose raw bytes are `bytes`, or nullopt.
  std::optional<int32_t> TokenForBytes(std::string_view bytes) const;

 private:
  BpeModel() = default;

  struct MergeTarget {
    int32_t rank;
    int32_t merged_id;  // >= pseudo_base_: a spelling that is no token (merges_by_spelling)
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void EncodeSmallWord(std::string_view bytes, std::vector<int32_t>* ids) const;
  // Appends `id`, or for a pseudo id the single-byte tokens of its spelling.
  void Emit(int32_t id, std::vector<int32_t>* ids) const;
  // Words up to this many bytes take the allocation-free quadratic path.
  static constexpr size_t kSmallWordBytes = 48;

  StringToId bytes_to_id_;                             // raw bytes -> id
  std::array<int32_t, 256> byte_ids_;                  // single-byte tokens; -1 if absent
  absl::flat_hash_map<uint64_t, MergeTarget> merges_;  // PairKey(left, right) -> rank, id
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  // Pseudo ids (merges_by_spelling): pseudo_base_ + i spells pseudo_emit_[i] as token ids.
  int32_t pseudo_base_ = 0;
  std::vector<std::vector<int32_t>> pseudo_emit_;
};

}  // namespace modserve::engine::internal

#endif  // MODSERVE_ENGINE_TOKENIZER_BPE_MODEL_H_
