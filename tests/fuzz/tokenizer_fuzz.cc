// Fuzz targets for the tokenizers: tokenizer.json loading, Encode on arbitrary bytes, Decode on
// arbitrary ids, and the incremental detokenizer's contract (its pieces concatenate to Decode).
// They run the demo byte-level BPE (models/demo) and the SentencePiece test model; they do not
// compare against the Python tokenizers (the golden tests do that).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/sentencepiece_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_util.h"

namespace modserve::fuzz {
namespace {

using engine::Tokenizer;

const Tokenizer& Load(bool sentencepiece) {
  // Loaded once per process and never freed; the targets only read them (Tokenizer is const).
  static const Tokenizer* const bpe = [] {
    auto t = engine::LoadTokenizer(std::string(MODSERVE_SOURCE_DIR) + "/models/demo");
    FUZZ_CHECK(t.ok(), t.status().ToString());
    return t->release();
  }();
  static const Tokenizer* const sp = [] {
    auto t = engine::LoadSentencePieceTokenizer(std::string(MODSERVE_SOURCE_DIR) +
                                                "/tests/testdata/tokenizer/sp/tokenizer.model");
    FUZZ_CHECK(t.ok(), t.status().ToString());
    return t->release();
  }();
  return sentencepiece ? *sp : *bpe;
}

std::string Ids(const std::vector<int32_t>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}

// True when Decode must accept `id`: it names a token of `tok`.
bool Named(const Tokenizer& tok, int32_t id) {
  return id >= 0 && id < tok.vocab_size() && tok.IdToToken(id).has_value();
}

// Checks ids from an Encode: each in range and naming a token.
void CheckEncoded(const Tokenizer& tok, const std::vector<int32_t>& ids, std::string_view text) {
  for (int32_t id : ids) {
    FUZZ_CHECK(Named(tok, id), absl::StrCat("Encode(\"", Escape(text), "\") gave id ", id,
                                            " that names no token"));
  }
}

}  // namespace

int FuzzBpeJson(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = engine::LoadBpeTokenizerFromJson(json);
  if (!tok.ok()) {
    FUZZ_CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument,
               absl::StrCat("rejection must be InvalidArgument: ", tok.status().ToString()));
    return 0;
  }
  const Tokenizer& t = **tok;
  FUZZ_CHECK(t.vocab_size() >= 0, "negative vocab_size");
  static constexpr std::string_view kSample = "Hello world, 123 \xc3\xbcn\xc3\xaf \xe2\x98\x83 <|bos|>";
  for (bool special : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids = t.Encode(kSample, special);
    // A vocabulary without some byte tokens cannot spell the sample; the tokenizer must say so.
    if (!ids.ok()) continue;
    CheckEncoded(t, *ids, kSample);
    absl::StatusOr<std::string> text = t.Decode(*ids, /*skip_special_tokens=*/false);
    FUZZ_CHECK(text.ok(), absl::StrCat("Decode of Encode's ids failed: ", text.status().ToString()));
    FUZZ_CHECK(IsStrictUtf8(*text), absl::StrCat("Decode gave invalid UTF-8: ", Escape(*text)));
  }
  for (int32_t id : {-1, 0, 1, t.vocab_size() - 1, t.vocab_size()}) {
    absl::StatusOr<std::string> text = t.Decode({id}, /*skip_special_tokens=*/false);
    FUZZ_CHECK(text.ok() == Named(t, id), absl::StrCat("Decode([", id, "]) ok=", text.ok()));
  }
  return 0;
}

int FuzzTokenizerEncode(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool sentencepiece = data[0] & 1;
  const bool add_special = data[0] & 2;
  const Tokenizer& tok = Load(sentencepiece);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, add_special);
  if (!IsStrictUtf8(text)) {
    FUZZ_CHECK(!ids.ok() && ids.status().code() == absl::StatusCode::kInvalidArgument,
               absl::StrCat("invalid UTF-8 \"", Escape(text), "\" must give InvalidArgument, got ",
                            ids.ok() ? std::string("OK") : ids.status().ToString()));
    return 0;
  }
  if (!ids.ok()) {
    // The regex engine's match limit is the one documented reason to refuse valid text.
    FUZZ_CHECK(ids.status().code() == absl::StatusCode::kInternal,
               absl::StrCat("Encode(\"", Escape(text), "\") failed: ", ids.status().ToString()));
    return 0;
  }
  CheckEncoded(tok, *ids, text);
  absl::StatusOr<std::string> back = tok.Decode(*ids, /*skip_special_tokens=*/false);
  FUZZ_CHECK(back.ok(), absl::StrCat("Decode(", Ids(*ids), ") failed: ", back.status().ToString()));
  FUZZ_CHECK(IsStrictUtf8(*back), absl::StrCat("Decode gave invalid UTF-8: ", Escape(*back)));
  // Byte-level BPE with no normalizer is lossless; SentencePiece normalizes (NFKC, spaces).
  if (!sentencepiece && !add_special) {
    FUZZ_CHECK(*back == text, absl::StrCat("round trip: \"", Escape(text), "\" -> ", Ids(*ids),
                                           " -> \"", Escape(*back), "\""));
  }
  return 0;
}

int FuzzTokenizerDecode(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool sentencepiece = data[0] & 1;
  const bool skip_special = data[0] & 2;
  const Tokenizer& tok = Load(sentencepiece);
  std::vector<int32_t> ids;
  bool all_named = true;
  for (size_t i = 1; i + 4 <= size; i += 4) {
    uint32_t raw;
    std::memcpy(&raw, data + i, 4);
    // Mostly ids near the vocabulary (edges included), sometimes any int32.
    const int32_t id = (raw & 0x80000000u) == 0
                           ? static_cast<int32_t>(raw % (tok.vocab_size() + 4u)) - 2
                           : static_cast<int32_t>(raw);
    ids.push_back(id);
    all_named = all_named && Named(tok, id);
  }
  absl::StatusOr<std::string> text = tok.Decode(ids, skip_special);
  if (!all_named) {
    FUZZ_CHECK(!text.ok() && text.status().code() == absl::StatusCode::kInvalidArgument,
               absl::StrCat("Decode(", Ids(ids), ") with an unnamed id must be InvalidArgument, ",
                            "got ", text.ok() ? std::string("OK") : text.status().ToString()));
    return 0;
  }
  FUZZ_CHECK(text.ok(), absl::StrCat("Decode(", Ids(ids), ") failed: ", text.status().ToString()));
  FUZZ_CHECK(IsStrictUtf8(*text), absl::StrCat("Decode gave invalid UTF-8: ", Escape(*text)));
  if (skip_special) {
    // Skipping special tokens is the same as not passing them.
    std::vector<int32_t> kept;
    for (int32_t id : ids) {
      if (!tok.IsSpecial(id)) kept.push_back(id);
    }
    absl::StatusOr<std::string> plain = tok.Decode(kept, /*skip_special_tokens=*/false);
    FUZZ_CHECK(plain.ok() && *plain == *text,
               absl::StrCat("Decode(", Ids(ids), ", skip) = \"", Escape(*text),
                            "\" but without the special ids \"",
                            plain.ok() ? Escape(*plain) : plain.status().ToString(), "\""));
  }
  return 0;
}

int FuzzDetokenizer(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool sentencepiece = data[0] & 1;
  const bool skip_special = data[0] & 2;
  const Tokenizer& tok = Load(sentencepiece);
  engine::IncrementalDetokenizer detok(tok, skip_special);
  std::vector<int32_t> accepted;
  std::string streamed;
  size_t i = 1;
  while (i < size) {
    // Record: one byte of chunk length (0..7), then that many 2-byte ids (mod vocab_size + 2,
    // so the two ids just past the vocabulary appear too).
    const size_t n = data[i++] % 8;
    std::vector<int32_t> chunk;
    bool chunk_ok = true;
    for (size_t k = 0; k < n && i + 2 <= size; ++k, i += 2) {
      const uint32_t raw = data[i] | (static_cast<uint32_t>(data[i + 1]) << 8);
      const int32_t id = static_cast<int32_t>(raw % (tok.vocab_size() + 2u));
      chunk.push_back(id);
      chunk_ok = chunk_ok && Named(tok, id);
    }
    absl::StatusOr<std::string> piece = detok.Add(chunk);
    if (!chunk_ok) {
      FUZZ_CHECK(!piece.ok() && piece.status().code() == absl::StatusCode::kInvalidArgument,
                 absl::StrCat("Add(", Ids(chunk), ") with an unnamed id must be InvalidArgument"));
      FUZZ_CHECK(detok.ids() == accepted, "a rejected chunk was kept");
      continue;
    }
    FUZZ_CHECK(piece.ok(), absl::StrCat("Add(", Ids(chunk), ") failed after ", Ids(accepted), ": ",
                                        piece.status().ToString()));
    FUZZ_CHECK(IsStrictUtf8(*piece), absl::StrCat("Add gave invalid UTF-8: ", Escape(*piece)));
    accepted.insert(accepted.end(), chunk.begin(), chunk.end());
    streamed += *piece;
  }
  absl::StatusOr<std::string> rest = detok.Flush();
  FUZZ_CHECK(rest.ok(), absl::StrCat("Flush failed: ", rest.status().ToString()));
  FUZZ_CHECK(IsStrictUtf8(*rest), absl::StrCat("Flush gave invalid UTF-8: ", Escape(*rest)));
  streamed += *rest;
  FUZZ_CHECK(detok.ids() == accepted, "ids() differs from the accepted ids");
  absl::StatusOr<std::string> full = tok.Decode(accepted, skip_special);
  FUZZ_CHECK(full.ok(), absl::StrCat("Decode(", Ids(accepted), ") failed"));
  FUZZ_CHECK(streamed == *full,
             absl::StrCat(sentencepiece ? "sp" : "bpe", skip_special ? " skip" : "", ": streamed \"",
                          Escape(streamed), "\" != Decode \"", Escape(*full), "\" for ",
                          Ids(accepted)));
  return 0;
}

}  // namespace modserve::fuzz
