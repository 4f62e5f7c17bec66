// modserve-quantize: writes a modserve checkpoint directory (dense or MoD) as one GGUF file with
// quantized matrices (DESIGN.md section 3.1). Dense outputs also run in llama.cpp.
//
//   modserve-quantize --model models/demo --out demo-q8_0.gguf --type q8_0
//   modserve-quantize --model DIR --out model-q4_k.gguf --type q4_k --embed_type q8_0
#include <cstdint>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tools/cli_usage.h"
#include "tools/gguf_export.h"

ABSL_FLAG(std::string, model, "", "checkpoint directory (config.json, safetensors, tokenizer.json)");
ABSL_FLAG(std::string, out, "", "the .gguf file to write");
ABSL_FLAG(std::string, type, "q8_0",
          "type of the weight matrices: q8_0, q4_k, q5_k, q4_0, q4_1, q5_0, q5_1, q6_k, f16, bf16 "
          "or f32 (norms, routers and predictors stay f32)");
ABSL_FLAG(std::string, embed_type, "", "type of token_embd and output; empty = --type");
ABSL_FLAG(int32_t, threads, 0,
          "threads that quantize each tensor's rows; 0 = every core (the file is the same for "
          "every count)");
ABSL_FLAG(bool, allow_no_tokenizer, false,
          "write the file without tokenizer metadata when tokenizer.json is absent or cannot be "
          "converted (tokenizer.ggml.model \"no_vocab\": modserve serves token ids, llama.cpp "
          "runs it with placeholder tokens)");

namespace {

int Fail(const std::string& what) {
  std::cerr << "modserve-quantize: " << what << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  modserve::cli::SetUsage("modserve-quantize --model DIR --out FILE.gguf [--type q8_0]", __FILE__);
  absl::ParseCommandLine(argc, argv);
  modserve::tools::ExportOptions opts;
  opts.model_dir = absl::GetFlag(FLAGS_model);
  opts.out_path = absl::GetFlag(FLAGS_out);
  if (opts.model_dir.empty() || opts.out_path.empty()) return Fail("--model and --out are required");
  const auto type = modserve::tools::ParseWeightType(absl::GetFlag(FLAGS_type));
  if (!type) return Fail("--type: unknown type '" + absl::GetFlag(FLAGS_type) + "'");
  opts.weight_type = *type;
  if (const std::string e = absl::GetFlag(FLAGS_embed_type); !e.empty()) {
    opts.embed_type = modserve::tools::ParseWeightType(e);
    if (!opts.embed_type) return Fail("--embed_type: unknown type '" + e + "'");
  }
  opts.allow_no_tokenizer = absl::GetFlag(FLAGS_allow_no_tokenizer);
  opts.num_threads = absl::GetFlag(FLAGS_threads);
  if (opts.num_threads < 0) return Fail("--threads must be >= 0");
  const absl::Status s = modserve::tools::ExportGguf(
      opts, [](std::string_view line) { std::cerr << "modserve-quantize: " << line << "\n"; });
  if (!s.ok()) return Fail(s.ToString());
  return 0;
}
