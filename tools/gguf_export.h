// ExportGguf: a modserve checkpoint directory (dense or MoD) written as one GGUF file
// (DESIGN.md section 3.1) with its matrices quantized, the library behind modserve-quantize.
// Q/K rows are written in llama.cpp's interleaved order and the tokenizer.json as llama.cpp's
// tokenizer.ggml.* metadata, so llama.cpp runs the dense output. It reads no GGUF input.
#ifndef MODSERVE_TOOLS_GGUF_EXPORT_H_
#define MODSERVE_TOOLS_GGUF_EXPORT_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/common/dtype.h"

namespace modserve::tools {

struct ExportOptions {
  std::string model_dir;  // a checkpoint directory (config.json + safetensors)
  std::string out_path;   // the .gguf file to write
  // The type of every 2-D weight matrix; token_embd and output take `embed_type` when set.
  // Norms, routers and predictors are always F32. A matrix whose row length is not a multiple
  // of the type's block falls back to Q8_0 (K-quants) or F16, and `log` says so.
  DType weight_type = DType::kQ8_0;
  std::optional<DType> embed_type;
  // Without a convertible tokenizer.json the export fails unless this is set; the file then
  // has no tokenizer metadata (modserve serves token ids; llama.cpp refuses such a file).
  bool allow_no_tokenizer = false;
  // Threads that quantize a tensor's rows (0: every core). The file's bytes do not depend on it.
  int num_threads = 0;
};

// Writes opts.out_path; `log` receives one line per notable decision (fallback types, the
// tokenizer) and a summary. Status codes: those of LoadModel for the input; InvalidArgument for
// a weight_type that is not a weight type, or a tokenizer it cannot convert (naming what);
// OutOfRange when a block's scale overflows f16 (QuantizeRow's, naming the tensor); Internal
// for I/O errors.
absl::Status ExportGguf(const ExportOptions& opts, const std::function<void(std::string_view)>& log);

// "q8_0" -> kQ8_0 and so on (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, any case); nullopt
// otherwise.
std::optional<DType> ParseWeightType(std::string_view name);

}  // namespace modserve::tools

#endif  // MODSERVE_TOOLS_GGUF_EXPORT_H_
