// LoadTokenizer: picks the tokenizer file in a model directory and hands it to the right loader.
// It reads files only; it never downloads or converts between formats.
#include "engine/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/sentencepiece_tokenizer.h"
#include "nlohmann/json.hpp"

namespace modserve::engine {
namespace {

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path.string(), "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read '", path.string(), "'"));
  return contents.str();
}

// tokenizer_config.json spells a token as "<s>" or as {"content": "<s>", ...}.
std::string TokenName(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  std::error_code ec;
  const std::filesystem::path json_path = dir / "tokenizer.json";
  if (std::filesystem::is_regular_file(json_path, ec)) {
    MODSERVE_ASSIGN_OR_RETURN(std::string json_text, ReadFile(json_path));
    std::string bos, eos;
    const std::filesystem::path config_path = dir / "tokenizer_config.json";
    if (std::filesystem::is_regular_file(config_path, ec)) {
      MODSERVE_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
      nlohmann::json config =
          nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
      if (!config.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", config_path.string(), "' is not a JSON object"));
      }
      bos = TokenName(config, "bos_token");
      eos = TokenName(config, "eos_token");
    }
    auto tokenizer = LoadBpeTokenizerFromJson(json_text, {bos, eos});
    if (!tokenizer.ok()) {
      return absl::Status(tokenizer.status().code(),
                          absl::StrCat(json_path.string(), ": ", tokenizer.status().message()));
    }
    return tokenizer;
  }
  const std::filesystem::path model_path = dir / "tokenizer.model";
  if (std::filesystem::is_regular_file(model_path, ec)) {
    return LoadSentencePieceTokenizer(model_path.string());
  }
  return absl::NotFoundError(
      absl::StrCat("no tokenizer.json or tokenizer.model in '", model_dir, "'"));
}

}  // namespace modserve::engine
