// A thin wrapper over sentencepiece::SentencePieceProcessor with no Abseil types in sight.
// Debian's sentencepiece_processor.h declares its own absl::string_view, which collides with
// Abseil's (built without std::string_view aliasing), so the library is only included by
// sentencepiece_model.cc, and that file includes no Abseil header. Errors are plain strings.
#ifndef MODSERVE_ENGINE_TOKENIZER_SENTENCEPIECE_MODEL_H_
#define MODSERVE_ENGINE_TOKENIZER_SENTENCEPIECE_MODEL_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace modserve::engine::internal {

// Immutable after Load(); all methods are const and safe to call from several threads.
class SentencePieceModel {
 public:
  // nullptr with `*error` set when `path` does not hold a SentencePiece model.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  ~SentencePieceModel();

  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;
  int piece_size() const;
  int PieceToId(std::string_view piece) const;
  const std::string& IdToPiece(int id) const;
  bool IsControl(int id) const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;

 private:
  explicit SentencePieceModel(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace modserve::engine::internal

#endif  // MODSERVE_ENGINE_TOKENIZER_SENTENCEPIECE_MODEL_H_
