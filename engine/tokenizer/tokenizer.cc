// LoadTokenizer: picks the tokenizer file in a model directory (or takes a GGUF file) and hands it
// to the right loader.
// It reads files only; it never downloads or converts between formats.
#include "engine/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/gguf_tokenizer.h"
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

// "chat_template" is a string or, in newer files, a list of named templates.
absl::StatusOr<std::string> ChatTemplate(const nlohmann::json& config,
                                         const std::string& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const nlohmann::json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" &&
          entry.contains("template") && entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return std::string();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", path, "': chat_template is neither a string nor a list of templates"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  // As LoadModel: a .gguf path is a GGUF file (and an error if it is not one).
  const bool gguf_name =
      model_dir.size() >= 5 && model_dir.compare(model_dir.size() - 5, 5, ".gguf") == 0;
  if (gguf_name || IsGgufFile(model_dir)) {
    MODSERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(model_dir));
    return LoadTokenizerFromGguf(file);
  }
  const std::filesystem::path dir(model_dir);
  std::error_code ec;
  std::string bos, eos, chat_template;
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config_path, ec)) {
    MODSERVE_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
    nlohmann::json config = nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", config_path.string(), "' is not a JSON object"));
    }
    bos = TokenName(config, "bos_token");
    eos = TokenName(config, "eos_token");
    MODSERVE_ASSIGN_OR_RETURN(chat_template, ChatTemplate(config, config_path.string()));
  }
  std::unique_ptr<Tokenizer> tokenizer;
  const std::filesystem::path json_path = dir / "tokenizer.json";
  const std::filesystem::path model_path = dir / "tokenizer.model";
  if (std::filesystem::is_regular_file(json_path, ec)) {
    MODSERVE_ASSIGN_OR_RETURN(std::string json_text, ReadFile(json_path));
    auto loaded = LoadBpeTokenizerFromJson(json_text, {bos, eos});
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(json_path.string(), ": ", loaded.status().message()));
    }
    tokenizer = *std::move(loaded);
  } else if (std::filesystem::is_regular_file(model_path, ec)) {
    MODSERVE_ASSIGN_OR_RETURN(tokenizer, LoadSentencePieceTokenizer(model_path.string()));
  } else {
    return absl::NotFoundError(
        absl::StrCat("no tokenizer.json or tokenizer.model in '", model_dir, "'"));
  }
  tokenizer->set_chat_template(std::move(chat_template));
  return tokenizer;
}

}  // namespace modserve::engine
