// Checkpoint directory -> GGUF: metadata from the config (the inverse of ConfigFromGguf, checked
// by loading the result back in the tests), tensors dequantized row by row to f32 and requantized
// with quant::QuantizeRow, one tensor in memory at a time.
#include "tools/gguf_export.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/quant.h"
#include "engine/common/status_macros.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_model.h"
#include "engine/model/gguf_writer.h"
#include "engine/model/weights.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace modserve::tools {
namespace {

using engine::GgufWriter;
using engine::ModelConfig;
using Json = nlohmann::json;

// llama.cpp's token types (llama_token_type), as tokenizer.ggml.token_type stores them.
constexpr int32_t kTokenNormal = 1, kTokenControl = 3, kTokenUserDefined = 4, kTokenUnused = 5;

// llama.cpp's general.file_type for a file whose matrices are mostly `t`.
uint32_t FileType(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ8_0:
      return 7;
    case DType::kQ5_0:
      return 8;
    case DType::kQ5_1:
      return 9;
    case DType::kQ4_K:
      return 14;  // Q4_K_S: every matrix Q4_K
    case DType::kQ5_K:
      return 16;  // Q5_K_S
    case DType::kQ6_K:
      return 18;
    case DType::kBF16:
      return 32;
    case DType::kI32:
      break;
  }
  return 0;
}

// The type a matrix of rows `row_len` long is stored in when `wanted` does not fit it.
DType FitType(DType wanted, int64_t row_len) {
  if (row_len % DTypeBlockElems(wanted) == 0) return wanted;
  if (DTypeIsQuantized(wanted) && row_len % DTypeBlockElems(DType::kQ8_0) == 0) {
    return DType::kQ8_0;
  }
  return DType::kF16;
}

// Runs fn over [0, rows) in contiguous ranges on up to `threads` threads (the caller one of them),
// no range much below 16K elements of rows `row_len` long, and returns the status of the lowest
// failing range: the same error whatever the thread count. fn writes disjoint rows.
absl::Status ForRowRanges(int64_t rows, int64_t row_len, int threads,
                          const std::function<absl::Status(int64_t, int64_t)>& fn) {
  constexpr int64_t kMinElems = int64_t{1} << 14;
  const int64_t by_size = std::max<int64_t>(1, rows * std::max<int64_t>(row_len, 1) / kMinElems);
  const int64_t parts = std::min<int64_t>({static_cast<int64_t>(threads), by_size, rows});
  if (parts <= 1) return fn(0, rows);
  std::vector<absl::Status> status(static_cast<size_t>(parts));
  auto run = [&](int64_t p) { status[p] = fn(rows * p / parts, rows * (p + 1) / parts); };
  std::vector<std::thread> workers;
  for (int64_t p = 1; p < parts; ++p) workers.emplace_back(run, p);
  run(0);
  for (std::thread& t : workers) t.join();
  for (absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Orders tensors as llama.cpp's converter does: token_embd, each block in order, then the head.
int64_t Rank(const std::string& gguf_name) {
  if (gguf_name == "token_embd.weight") return -1;
  if (absl::StartsWith(gguf_name, "blk.")) {
    int64_t l = 0;
    const size_t dot = gguf_name.find('.', 4);
    if (absl::SimpleAtoi(absl::string_view(gguf_name).substr(4, dot - 4), &l)) return l;
  }
  return int64_t{1} << 40;
}

absl::Status AddModelMetadata(const ModelConfig& c, const std::string& name, DType weight_type,
                              GgufWriter* w, const std::function<void(std::string_view)>& log) {
  w->AddString("general.architecture", std::string(engine::kGgufArchitecture));
  w->AddString("general.name", name);
  w->AddU32("general.file_type", FileType(weight_type));
  if (DTypeIsQuantized(weight_type)) w->AddU32("general.quantization_version", 2);
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };  // validated < 2^31
  w->AddU32("llama.context_length", u32(c.max_seq_len));
  w->AddU32("llama.embedding_length", u32(c.d_model));
  w->AddU32("llama.block_count", u32(c.n_layers));
  w->AddU32("llama.feed_forward_length", u32(c.d_ff));
  w->AddU32("llama.attention.head_count", u32(c.n_heads));
  w->AddU32("llama.attention.head_count_kv", u32(c.n_kv_heads));
  w->AddU32("llama.attention.key_length", u32(c.head_dim));
  w->AddU32("llama.attention.value_length", u32(c.head_dim));
  w->AddU32("llama.rope.dimension_count", u32(c.head_dim));
  // llama.cpp reads these two as FLOAT32 (and so does it compute with them).
  w->AddF32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w->AddF32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w->AddU32("llama.vocab_size", u32(c.vocab_size));
  // Stop tokens: GGUF has one eos and one end-of-turn id (ConfigFromGguf reads both back).
  if (c.bos_token_id) w->AddU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*c.bos_token_id));
  if (!c.eos_token_ids.empty()) {
    w->AddU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_ids[0]));
  }
  if (c.eos_token_ids.size() >= 2) {
    w->AddU32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(c.eos_token_ids[1]));
  }
  if (c.eos_token_ids.size() > 2) {
    log(absl::StrCat("eos_token_id: ", c.eos_token_ids.size(), " ids, GGUF keeps the first two "
                     "(tokenizer.ggml.eos_token_id and eot_token_id)"));
  }
  if (!c.mod) return absl::OkStatus();

  const engine::ModConfig& m = *c.mod;
  const std::string p(engine::kGgufModPrefix);
  w->AddU32(p + "format_version", static_cast<uint32_t>(m.format_version));
  w->AddI32Array(p + "routed_layers", std::vector<int32_t>(m.routed_layers.begin(),
                                                           m.routed_layers.end()));
  if (std::adjacent_find(m.capacities.begin(), m.capacities.end(), std::not_equal_to<>()) ==
      m.capacities.end()) {
    w->AddF64(p + "capacity", m.capacity);
  } else {
    w->AddF64Array(p + "capacity", m.capacities);
  }
  w->AddBool(p + "router.bias", m.router.bias);
  w->AddString(p + "router.input", std::string(engine::EnumName(m.router.input)));
  w->AddString(p + "weight_fn", std::string(engine::EnumName(m.weight_fn)));
  w->AddString(p + "scale_target", std::string(engine::EnumName(m.scale_target)));
  w->AddString(p + "inference_routing", std::string(engine::EnumName(m.inference_routing)));
  w->AddF64(p + "threshold", m.threshold);
  if (!m.layer_thresholds.empty()) w->AddF64Array(p + "layer_thresholds", m.layer_thresholds);
  if (m.predictor) {
    const engine::PredictorConfig& pc = *m.predictor;
    w->AddString(p + "predictor.type", std::string(engine::EnumName(pc.type)));
    if (pc.type == engine::PredictorType::kMlp) {
      w->AddU32(p + "predictor.hidden_size", static_cast<uint32_t>(pc.hidden_size));
      w->AddString(p + "predictor.activation", std::string(engine::EnumName(pc.activation)));
    }
    w->AddBool(p + "predictor.bias", pc.bias);
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
}

// tokenizer.json (a byte-level BPE with the GPT-2 pre-tokenizer) -> tokenizer.ggml.* keys.
absl::Status AddTokenizerMetadata(const std::string& model_dir, const ModelConfig& c,
                                  GgufWriter* w, const std::function<void(std::string_view)>& log) {
  const std::string path = model_dir + "/tokenizer.json";
  MODSERVE_ASSIGN_OR_RETURN(const Json tok, ReadJson(path));
  auto unsupported = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", what, "; only a byte-level BPE with the GPT-2 pre-tokenizer converts to "
        "llama.cpp's tokenizer.ggml.* keys (--allow_no_tokenizer writes the file without one)"));
  };
  try {
    const Json& model = tok.at("model");
    if (model.value("type", "") != "BPE") return unsupported("the model is not a BPE");
    const Json& pre = tok.at("pre_tokenizer");
    if (!pre.is_object() || pre.value("type", "") != "ByteLevel" || !pre.value("use_regex", true) ||
        pre.value("add_prefix_space", false)) {
      return unsupported(absl::StrCat("pre-tokenizer ", pre.dump().substr(0, 80)));
    }
    if (tok.contains("normalizer") && !tok["normalizer"].is_null()) {
      return unsupported(absl::StrCat("normalizer ", tok["normalizer"].dump().substr(0, 80)));
    }
    const int64_t vocab = c.vocab_size;
    std::vector<std::string> tokens(static_cast<size_t>(vocab));
    std::vector<int32_t> types(static_cast<size_t>(vocab), kTokenUnused);
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    auto place = [&](const std::string& piece, int64_t id, int32_t type) -> absl::Status {
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": token '", piece, "' has id ", id,
                                                       ", outside the vocabulary [0, ", vocab,
                                                       ")"));
      }
      tokens[static_cast<size_t>(id)] = piece;
      types[static_cast<size_t>(id)] = type;
      seen[static_cast<size_t>(id)] = true;
      return absl::OkStatus();
    };
    for (const auto& [piece, id] : model.at("vocab").items()) {
      MODSERVE_RETURN_IF_ERROR(place(piece, id.get<int64_t>(), kTokenNormal));
    }
    if (tok.contains("added_tokens")) {
      for (const Json& a : tok["added_tokens"]) {
        MODSERVE_RETURN_IF_ERROR(place(a.at("content").get<std::string>(),
                                       a.at("id").get<int64_t>(),
                                       a.value("special", false) ? kTokenControl
                                                                 : kTokenUserDefined));
      }
    }
    int64_t padded = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!seen[static_cast<size_t>(i)]) {
        tokens[static_cast<size_t>(i)] = absl::StrCat("[PAD", i, "]");  // as llama.cpp pads
        ++padded;
      }
    }
    std::vector<std::string> merges;
    for (const Json& m : model.at("merges")) {
      merges.push_back(m.is_string() ? m.get<std::string>()
                                     : absl::StrCat(m.at(0).get<std::string>(), " ",
                                                    m.at(1).get<std::string>()));
    }
    // add_bos: the post-processor's single-sequence template starts with the bos token.
    bool add_bos = false;
    if (tok.contains("post_processor") && tok["post_processor"].is_object() &&
        tok["post_processor"].value("type", "") == "TemplateProcessing" && c.bos_token_id) {
      const Json& single = tok["post_processor"].at("single");
      if (!single.empty() && single[0].contains("SpecialToken")) {
        const std::string first = single[0]["SpecialToken"].at("id").get<std::string>();
        add_bos = first == tokens[static_cast<size_t>(*c.bos_token_id)];
      }
    }
    w->AddString("tokenizer.ggml.model", "gpt2");
    w->AddString("tokenizer.ggml.pre", "gpt-2");
    w->AddStringArray("tokenizer.ggml.tokens", tokens);
    w->AddI32Array("tokenizer.ggml.token_type", types);
    w->AddStringArray("tokenizer.ggml.merges", merges);
    w->AddBool("tokenizer.ggml.add_bos_token", add_bos);
    w->AddBool("tokenizer.ggml.add_eos_token", false);
    log(absl::StrCat("tokenizer: byte-level BPE (gpt2 / gpt-2), ", vocab, " tokens (", padded,
                     " padding), ", merges.size(), " merges, add_bos ", add_bos ? "true" : "false"));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected content: ", e.what()));
  }
  // The chat template, as the tokenizer unit reads it from tokenizer_config.json.
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> t = engine::LoadTokenizer(model_dir);
  if (t.ok() && !(*t)->chat_template().empty()) {
    w->AddString("tokenizer.chat_template", (*t)->chat_template());
    log("tokenizer: chat template copied");
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<DType> ParseWeightType(std::string_view name) {
  std::string n(name);
  for (char& ch : n) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    if (n == DTypeName(t)) return t;
  }
  return std::nullopt;
}

absl::Status ExportGguf(const ExportOptions& opts,
                        const std::function<void(std::string_view)>& log) {
  for (DType t : {opts.weight_type, opts.embed_type.value_or(opts.weight_type)}) {
    if (!engine::GgmlTypeFromDType(t).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight type ", std::string(DTypeName(t)), " is not a weight type"));
    }
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(opts.model_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(opts.model_dir, ": not a checkpoint directory (config.json + safetensors)"));
  }
  MODSERVE_ASSIGN_OR_RETURN(engine::LoadedModel model, engine::LoadModel(opts.model_dir));
  const ModelConfig& c = model.config();

  GgufWriter w;
  const std::string name = std::filesystem::path(opts.model_dir).lexically_normal().filename();
  MODSERVE_RETURN_IF_ERROR(AddModelMetadata(c, name.empty() ? "model" : name, opts.weight_type, &w, log));
  const std::string tokenizer_json = opts.model_dir + "/tokenizer.json";
  // Without a tokenizer the file says so as llama.cpp does (tokenizer.ggml.model "no_vocab"):
  // llama.cpp then loads it with llama.vocab_size placeholder tokens (llama-bench runs it) and
  // modserve serves token ids.
  if (std::filesystem::exists(tokenizer_json, ec)) {
    absl::Status s = AddTokenizerMetadata(opts.model_dir, c, &w, log);
    if (!s.ok()) {
      if (!opts.allow_no_tokenizer) return s;
      log(absl::StrCat("tokenizer: not converted (", s.message(), ")"));
      w.AddString("tokenizer.ggml.model", "no_vocab");
    }
  } else if (!opts.allow_no_tokenizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        tokenizer_json, ": no such file; --allow_no_tokenizer writes the file without a "
        "tokenizer (tokenizer.ggml.model \"no_vocab\"; modserve serves token ids)"));
  } else {
    log("tokenizer: none (no tokenizer.json; tokenizer.ggml.model \"no_vocab\")");
    w.AddString("tokenizer.ggml.model", "no_vocab");
  }

  std::vector<engine::TensorNamePair> table = engine::TensorNameTable(c);
  std::stable_sort(table.begin(), table.end(), [](const auto& a, const auto& b) {
    return Rank(a.gguf_name) < Rank(b.gguf_name);
  });
  std::map<std::string, int> type_counts;
  const int threads = opts.num_threads > 0
                          ? opts.num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (const engine::TensorNamePair& t : table) {
    // A MoD adapter's routers and predictors are in its own file, the rest in the base's.
    const engine::Checkpoint& from = model.adapter() != nullptr && model.adapter()->Contains(t.hf_name)
                                         ? *model.adapter()
                                         : model.checkpoint();
    MODSERVE_ASSIGN_OR_RETURN(const TensorView src, from.Get(t.hf_name));
    const bool matrix = t.shape.size() == 2 && !absl::StrContains(t.gguf_name, ".mod_");
    const bool embed = t.gguf_name == "token_embd.weight" || t.gguf_name == "output.weight";
    const DType wanted =
        !matrix ? DType::kF32 : embed ? opts.embed_type.value_or(opts.weight_type)
                                      : opts.weight_type;
    const int64_t row_len = t.shape.back();
    const int64_t rows = src.numel() / std::max<int64_t>(row_len, 1);
    const DType type = FitType(wanted, row_len);
    if (type != wanted) {
      log(absl::StrCat(t.gguf_name, ": rows of ", row_len, " are not a multiple of ",
                       std::string(DTypeName(wanted)), "'s block of ", DTypeBlockElems(wanted),
                       "; stored as ", std::string(DTypeName(type))));
    }
    ++type_counts[std::string(DTypeName(type))];
    // GGUF row g of q/k is Hugging Face row src_row[g] (llama.cpp's interleaved order).
    std::vector<int64_t> src_row(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) src_row[static_cast<size_t>(r)] = r;
    if (absl::EndsWith(t.gguf_name, ".attn_q.weight") ||
        absl::EndsWith(t.gguf_name, ".attn_k.weight")) {
      for (int64_t r = 0; r < rows; ++r) {
        src_row[static_cast<size_t>(engine::GgufRowOfHfRow(r, c.head_dim))] = r;
      }
    }
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    const std::string tensor_name = t.gguf_name;
    const size_t src_row_bytes = DTypeRowBytes(src.dtype, row_len);
    const size_t dst_row_bytes = DTypeRowBytes(type, row_len);
    w.AddTensor(t.gguf_name, *engine::GgmlTypeFromDType(type), ne,
                [=, src_row = std::move(src_row)](uint8_t* dst) -> absl::Status {
                  const uint8_t* base = static_cast<const uint8_t*>(src.data);
                  // Rows [begin, end) into dst; the first failing row's status.
                  auto quantize = [&](int64_t begin, int64_t end) -> absl::Status {
                    std::vector<float> row(static_cast<size_t>(row_len));
                    for (int64_t g = begin; g < end; ++g) {
                      quant::DequantizeRow(src.dtype,
                                           base + static_cast<size_t>(src_row[g]) * src_row_bytes,
                                           row_len, row.data());
                      absl::Status s = quant::QuantizeRow(
                          type, row.data(), row_len, dst + static_cast<size_t>(g) * dst_row_bytes);
                      if (!s.ok()) {
                        return absl::Status(s.code(), absl::StrCat("tensor '", tensor_name,
                                                                   "' row ", g, ": ", s.message()));
                      }
                    }
                    return absl::OkStatus();
                  };
                  return ForRowRanges(rows, row_len, threads, quantize);
                });
  }
  MODSERVE_RETURN_IF_ERROR(w.Write(opts.out_path));
  std::string summary;
  for (const auto& [type, n] : type_counts) absl::StrAppend(&summary, " ", type, " x", n);
  log(absl::StrCat("wrote ", opts.out_path, ": ", table.size(), " tensors (", summary.substr(1),
                   "), ", std::filesystem::file_size(opts.out_path, ec), " bytes"));
  return absl::OkStatus();
}

}  // namespace modserve::tools
