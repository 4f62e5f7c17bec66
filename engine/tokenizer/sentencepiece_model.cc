// The only file that includes libsentencepiece's header; it must not include Abseil (see the
// header for why).
#include "engine/tokenizer/sentencepiece_model.h"

#include <sentencepiece_processor.h>

#include <utility>

namespace modserve::engine::internal {

SentencePieceModel::SentencePieceModel(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
    : sp_(std::move(sp)) {}

SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const sentencepiece::util::Status status = sp->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(std::move(sp)));
}

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  const sentencepiece::util::Status status = sp_->Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceModel::Decode(const std::vector<int>& ids, std::string* text,
                                std::string* error) const {
  const sentencepiece::util::Status status = sp_->Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int SentencePieceModel::piece_size() const { return sp_->GetPieceSize(); }
int SentencePieceModel::PieceToId(std::string_view piece) const { return sp_->PieceToId(piece); }
const std::string& SentencePieceModel::IdToPiece(int id) const { return sp_->IdToPiece(id); }
bool SentencePieceModel::IsControl(int id) const { return sp_->IsControl(id); }
int SentencePieceModel::bos_id() const { return sp_->bos_id(); }
int SentencePieceModel::eos_id() const { return sp_->eos_id(); }

}  // namespace modserve::engine::internal
