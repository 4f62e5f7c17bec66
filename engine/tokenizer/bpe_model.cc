// Byte alphabet and BPE merge loop. The merge order (lowest rank first, then leftmost) is the
// one `tokenizers` and llama.cpp share; only their treatment of odd merge tables differs
// (BpeModelOptions).
#include "engine/tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace modserve::engine::internal {
namespace {

struct ByteAlphabet {
  std::array<char32_t, 256> byte_to_char;
  absl::flat_hash_map<char32_t, uint8_t> char_to_byte;
};

// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map to
// themselves, the other 68 to U+0100 onwards in byte order.
const ByteAlphabet& GetByteAlphabet() {
  static const ByteAlphabet* const alphabet = [] {
    auto* a = new ByteAlphabet();
    char32_t next_unprintable = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      a->byte_to_char[b] = printable ? static_cast<char32_t>(b) : next_unprintable++;
      a->char_to_byte[a->byte_to_char[b]] = static_cast<uint8_t>(b);
    }
    return a;
  }();
  return *alphabet;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    // The alphabet stays below U+0800; wider characters never reach here.
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Concat(std::string_view a, std::string_view b) {
  std::string s;
  s.reserve(a.size() + b.size());
  s.append(a);
  s.append(b);
  return s;
}

}  // namespace

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  int len = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  char32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  *pos += len;
  return cp;
}

std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  const ByteAlphabet& alphabet = GetByteAlphabet();
  std::string bytes;
  size_t pos = 0;
  while (pos < token.size()) {
    auto it = alphabet.char_to_byte.find(NextCodePoint(token, &pos));
    if (it == alphabet.char_to_byte.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(it->second));
  }
  return bytes;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const ByteAlphabet& alphabet = GetByteAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) AppendUtf8(alphabet.byte_to_char[b], &out);
  return out;
}

absl::StatusOr<BpeModel> BpeModel::Create(
    absl::Span<const std::pair<std::string_view, int32_t>> tokens,
    absl::Span<const std::pair<std::string_view, std::string_view>> merges,
    const BpeModelOptions& options) {
  BpeModel model;
  model.ignore_merges_ = options.ignore_merges;
  model.unk_id_ = options.unk_id;
  StringToId spelling_to_id;
  int32_t max_id = -1;
  for (const auto& [spelling, id] : tokens) {
    spelling_to_id.insert_or_assign(spelling, id);
    max_id = std::max(max_id, id);
  }
  model.byte_ids_.fill(-1);
  for (const auto& [spelling, id] : spelling_to_id) {
    if (std::optional<std::string> bytes = ByteLevelToBytes(spelling)) {
      if (bytes->size() == 1) model.byte_ids_[static_cast<unsigned char>((*bytes)[0])] = id;
      model.bytes_to_id_.insert_or_assign(std::move(*bytes), id);
    }
  }

  // Merging by spelling: spellings that are no token still take part, under pseudo ids.
  StringToId pseudo;
  model.pseudo_base_ = max_id + 1;
  auto pseudo_id = [&](std::string spelling) {
    auto [it, inserted] = pseudo.try_emplace(
        spelling, model.pseudo_base_ + static_cast<int32_t>(model.pseudo_emit_.size()));
    if (inserted) {
      // What llama.cpp emits for a final piece that is no token: each byte of its spelling's
      // UTF-8 taken as a one-byte spelling, where one exists.
      std::vector<int32_t> emit;
      for (char c : spelling) {
        auto t = spelling_to_id.find(std::string_view(&c, 1));
        if (t != spelling_to_id.end()) emit.push_back(t->second);
      }
      model.pseudo_emit_.push_back(std::move(emit));
    }
    return it->second;
  };
  if (options.merges_by_spelling) {
    const ByteAlphabet& alphabet = GetByteAlphabet();
    for (int b = 0; b < 256; ++b) {
      if (model.byte_ids_[b] >= 0) continue;
      std::string spelling;
      AppendUtf8(alphabet.byte_to_char[b], &spelling);
      model.byte_ids_[b] = pseudo_id(std::move(spelling));
    }
    for (const auto& [left, right] : merges) {
      std::string merged = Concat(left, right);
      if (!spelling_to_id.contains(merged)) pseudo_id(std::move(merged));
    }
  }
  auto lookup = [&](std::string_view spelling) -> std::optional<int32_t> {
    if (auto it = spelling_to_id.find(spelling); it != spelling_to_id.end()) return it->second;
    if (auto it = pseudo.find(spelling); it != pseudo.end()) return it->second;
    return std::nullopt;
  };

  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    std::optional<int32_t> l = lookup(left);
    std::optional<int32_t> r = lookup(right);
    std::optional<int32_t> merged = lookup(Concat(left, right));
    if (!l || !r || !merged) {
      // By spelling, a part no token or merge result spells can never form: the merge is inert.
      if (options.merges_by_spelling) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("merge #", rank, " '", std::string(left), " ", std::string(right),
                       "': a part or the result is not in the vocab"));
    }
    const MergeTarget target{static_cast<int32_t>(rank), *merged};
    if (options.first_rank_wins) {
      model.merges_.try_emplace(PairKey(*l, *r), target);
    } else {
      // `tokenizers` collects merges into a HashMap, where a later insert overwrites.
      model.merges_.insert_or_assign(PairKey(*l, *r), target);
    }
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenForBytes(std::string_view bytes) const {
  auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::Emit(int32_t id, std::vector<int32_t>* ids) const {
  if (id < pseudo_base_) {
    ids->push_back(id);
    return;
  }
  const std::vector<int32_t>& emit = pseudo_emit_[id - pseudo_base_];
  ids->insert(ids->end(), emit.begin(), emit.end());
}

void BpeModel::EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (bytes.empty()) return;
  if (ignore_merges_ || bytes.size() == 1) {
    auto it = bytes_to_id_.find(bytes);
    if (it != bytes_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (bytes.size() <= kSmallWordBytes) {
    EncodeSmallWord(bytes, ids);
    return;
  }
  // Doubly linked symbols plus a min-heap of candidate merges (rank, then leftmost position):
  // the reference's exact order, in O(n log n) even for a long run of one repeated character.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  for (unsigned char b : bytes) {
    int32_t id = byte_ids_[b];
    if (id < 0) {
      if (!unk_id_) continue;  // the reference drops bytes with no token when there is no unk
      id = *unk_id_;
    }
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.merged_id});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Entries go stale when a neighbour merged first; the pair must still yield the same token.
    auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    Symbol& right = symbols[left.next];
    right.alive = false;
    left.id = top.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) Emit(s.id, ids);
  }
}

void BpeModel::EncodeSmallWord(std::string_view bytes, std::vector<int32_t>* ids) const {
  // Same order as the heap in EncodeWord (lowest rank, then leftmost), found by a linear scan
  // over at most kSmallWordBytes symbols on the stack: no allocation for the common short word.
  constexpr int32_t kNoMerge = INT32_MAX;
  std::array<int32_t, kSmallWordBytes> symbols;
  std::array<MergeTarget, kSmallWordBytes> pairs;  // pairs[i]: merge of symbols i and i + 1
  int n = 0;
  for (unsigned char b : bytes) {
    int32_t id = byte_ids_[b];
    if (id < 0) {
      if (!unk_id_) continue;
      id = *unk_id_;
    }
    symbols[n++] = id;
  }
  auto lookup = [&](int i) {
    auto it = merges_.find(PairKey(symbols[i], symbols[i + 1]));
    pairs[i] = it == merges_.end() ? MergeTarget{kNoMerge, -1} : it->second;
  };
  for (int i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    int best = -1;
    for (int i = 0; i + 1 < n; ++i) {
      if (pairs[i].rank != kNoMerge && (best < 0 || pairs[i].rank < pairs[best].rank)) best = i;
    }
    if (best < 0) break;
    symbols[best] = pairs[best].merged_id;
    for (int i = best + 1; i + 1 < n; ++i) {
      symbols[i] = symbols[i + 1];
      pairs[i] = pairs[i + 1];
    }
    --n;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  for (int i = 0; i < n; ++i) Emit(symbols[i], ids);
}

}  // namespace modserve::engine::internal
