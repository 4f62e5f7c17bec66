// SentencePiece behind the Tokenizer interface: status conversion, id checks, BOS and special
// tokens. The model is immutable after Load and its methods are const, so sharing is safe.
#include "engine/tokenizer/sentencepiece_tokenizer.h"

#include <filesystem>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/sentencepiece_model.h"
#include "engine/tokenizer/utf8.h"

namespace modserve::engine {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<internal::SentencePieceModel> sp)
      : sp_(std::move(sp)) {}

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override {
    const size_t bad = FirstInvalidUtf8Offset(text);
    if (bad != text.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("text is not valid UTF-8 at byte ", bad, " of ", text.size()));
    }
    std::vector<int> pieces;
    std::string error;
    if (!sp_->Encode(text, &pieces, &error)) {
      return absl::InternalError(absl::StrCat("sentencepiece Encode: ", error));
    }
    std::vector<int32_t> ids;
    ids.reserve(pieces.size() + 1);
    if (add_special_tokens && sp_->bos_id() >= 0) ids.push_back(sp_->bos_id());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const override {
    std::vector<int> kept;
    kept.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside [0, vocab_size ", vocab_size(), ")"));
      }
      if (skip_special_tokens && IsSpecial(id)) continue;
      kept.push_back(id);
    }
    std::string text, error;
    if (!sp_->Decode(kept, &text, &error)) {
      return absl::InternalError(absl::StrCat("sentencepiece Decode: ", error));
    }
    return text;
  }

  int vocab_size() const override { return sp_->piece_size(); }

  std::optional<int32_t> TokenToId(std::string_view token) const override {
    // PieceToId answers unk_id for unknown pieces; only a round trip tells the two apart.
    const int id = sp_->PieceToId(token);
    if (id < 0 || sp_->IdToPiece(id) != token) return std::nullopt;
    return id;
  }

  std::optional<std::string_view> IdToToken(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return std::nullopt;
    return std::string_view(sp_->IdToPiece(id));
  }

  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() && sp_->IsControl(id);
  }

  std::optional<int32_t> bos_id() const override {
    return sp_->bos_id() >= 0 ? std::optional<int32_t>(sp_->bos_id()) : std::nullopt;
  }
  std::optional<int32_t> eos_id() const override {
    return sp_->eos_id() >= 0 ? std::optional<int32_t>(sp_->eos_id()) : std::nullopt;
  }

 private:
  std::unique_ptr<internal::SentencePieceModel> sp_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("no SentencePiece model at '", path, "'"));
  }
  std::string error;
  std::unique_ptr<internal::SentencePieceModel> sp =
      internal::SentencePieceModel::Load(path, &error);
  if (sp == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a SentencePiece model: ", error));
  }
  return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(std::move(sp)));
}

}  // namespace modserve::engine
