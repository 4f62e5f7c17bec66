// Block-quantized weights on every backend: a backend either runs them or the model is refused
// before anything runs, with an error that names the backend, the tensor and its type. The model
// is models/demo (the MoD checkpoint) written as GGUF by ExportGguf (modserve-quantize's
// library) at each quantized type.
//  - A backend without quantized kernels (the CPU backend behind a Supports() that says no, so
//    the refusal is checked on every machine): Transformer::Create fails naming the first
//    quantized tensor, with the embedding table quantized or only the layer matrices; the same
//    wrapper runs the F32 export, so the refusal is the type's alone.
//  - Every compiled backend through Engine::Create, as a user starts it (`--backend NAME`): it
//    generates from the Q8_0 file when Supports() says it runs Q8_0, and is refused naming the
//    tensor and type otherwise (the CUDA backend today; it skips where no GPU is visible).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/registry.h"
#include "engine/engine.h"
#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/model/transformer.h"
#include "engine/model/weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/checkpoint_test_util.h"
#include "tools/gguf_export.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::StatusIs;
using backend::Backend;
using backend::OpKind;

const std::string kDemo = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";

// The CPU backend, except that it claims no block-quantized type.
class NoQuantBackend : public Backend {
 public:
  explicit NoQuantBackend(std::unique_ptr<Backend> cpu) : cpu_(std::move(cpu)) {}
  std::string_view name() const override { return "no-quant"; }
  Device device() const override { return cpu_->device(); }
  bool Supports(OpKind op, DType dtype) const override {
    return !DTypeIsQuantized(dtype) && cpu_->Supports(op, dtype);
  }
  absl::StatusOr<backend::DeviceBuffer> Allocate(size_t bytes) override {
    return cpu_->Allocate(bytes);
  }
  absl::Status CopyToDevice(const TensorView& src, const TensorView& dst) override {
    return cpu_->CopyToDevice(src, dst);
  }
  absl::Status CopyToHost(const TensorView& src, const TensorView& dst) override {
    return cpu_->CopyToHost(src, dst);
  }
  absl::Status Synchronize() override { return cpu_->Synchronize(); }
  void Embed(const TensorView& ids, const TensorView& table, const TensorView& out) override {
    cpu_->Embed(ids, table, out);
  }
  void RmsNorm(const backend::RmsNormParams& p, const TensorView& x, const TensorView& w,
               const TensorView& out) override {
    cpu_->RmsNorm(p, x, w, out);
  }
  void Gemm(const TensorView& x, const TensorView& w, const TensorView& bias,
            const TensorView& out) override {
    cpu_->Gemm(x, w, bias, out);
  }
  void RopeAndAppendKv(const backend::RopeParams& p, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& positions, const TensorView& slots,
                       const TensorView& kv_pool) override {
    cpu_->RopeAndAppendKv(p, q, k, v, positions, slots, kv_pool);
  }
  void Attention(const backend::AttentionParams& p, const TensorView& q, const TensorView& kv_pool,
                 const TensorView& page_table, const TensorView& row_seq,
                 const TensorView& row_kv_len, const TensorView& out) override {
    cpu_->Attention(p, q, kv_pool, page_table, row_seq, row_kv_len, out);
  }
  void SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out) override {
    cpu_->SwiGlu(gate, up, out);
  }
  void Activation(const backend::ActivationParams& p, const TensorView& x) override {
    cpu_->Activation(p, x);
  }
  void Add(const TensorView& a, const TensorView& b, const TensorView& out) override {
    cpu_->Add(a, b, out);
  }
  void GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out) override {
    cpu_->GatherRows(x, idx, out);
  }
  void ScatterCombine(const backend::ScatterCombineParams& p, const TensorView& x,
                      const TensorView& y, const TensorView& idx, const TensorView& s) override {
    cpu_->ScatterCombine(p, x, y, idx, s);
  }
  void RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                   const TensorView& probs, const TensorView& idx, const TensorView& s_sel,
                   const TensorView& count) override {
    cpu_->RouteSelect(z, z_cut, s, probs, idx, s_sel, count);
  }
  void RouteRows(const TensorView& idx, const TensorView& row_seq, const TensorView& row_pos,
                 const TensorView& cand_slots, const TensorView& seq_first_row,
                 const TensorView& seq_kv_base, const TensorView& out_pos,
                 const TensorView& out_slots, const TensorView& out_seq,
                 const TensorView& out_kv_len) override {
    cpu_->RouteRows(idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base, out_pos,
                    out_slots, out_seq, out_kv_len);
  }
  void CopyKvPages(const TensorView& kv_pool,
                   absl::Span<const std::pair<int32_t, int32_t>> copies) override {
    cpu_->CopyKvPages(kv_pool, copies);
  }

 private:
  std::unique_ptr<Backend> cpu_;
};

class QuantizedWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("quantized_weights_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // models/demo as GGUF with `type` matrices (and the embedding table at `embed`, when set).
  std::string Export(DType type, std::optional<DType> embed = std::nullopt) {
    const std::string path =
        (dir_ / (std::string(DTypeName(type)) + (embed ? "_embed" : "") + ".gguf")).string();
    tools::ExportOptions o;
    o.model_dir = kDemo;
    o.out_path = path;
    o.weight_type = type;
    o.embed_type = embed;
    const absl::Status s = tools::ExportGguf(o, [](std::string_view) {});
    EXPECT_TRUE(s.ok()) << s;
    return path;
  }

  // Transformer::Create on `backend` for the model at `path`.
  static absl::Status Create(const std::string& path, Backend* backend, LoadedModel* keep) {
    absl::StatusOr<LoadedModel> m = LoadModel(path);
    if (!m.ok()) return m.status();
    *keep = *std::move(m);
    const ModelConfig& cfg = keep->config();
    constexpr int32_t kBlock = 16, kPages = 64;
    absl::StatusOr<std::unique_ptr<KvCacheManager>> kv = KvCacheManager::Create(
        kPages, kBlock, static_cast<int32_t>(cfg.n_layers),
        KvCacheManager::BytesPerPage(static_cast<int32_t>(cfg.n_kv_heads), kBlock,
                                     static_cast<int32_t>(cfg.head_dim), DType::kF32));
    if (!kv.ok()) return kv.status();
    TransformerOptions to;
    to.max_batch_tokens = 64;
    to.max_seqs = 2;
    to.block_size = kBlock;
    to.num_pages = kPages;
    return Transformer::Create(cfg, keep->weights(), backend, kv->get(), to).status();
  }

  static std::unique_ptr<Backend> NoQuant() {
    absl::StatusOr<std::unique_ptr<Backend>> cpu = backend::CreateBackend("cpu", {});
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    return std::make_unique<NoQuantBackend>(*std::move(cpu));
  }

  std::filesystem::path dir_;
};

TEST_F(QuantizedWeightsTest, BackendWithoutQuantizedKernelsIsRefusedNamingTensorAndType) {
  std::unique_ptr<Backend> be = NoQuant();
  for (DType type :
       {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(DTypeName(type));
    // Everything quantized: the embedding table is the first tensor checked. (The demo's rows
    // of 192 are no multiple of 256: its K-quant export stores them as Q8_0.)
    const std::string all = Export(type);
    absl::StatusOr<LoadedModel> probe = LoadModel(all);
    ASSERT_TRUE(probe.ok()) << probe.status();
    const DType embed = probe->weights().embed_tokens.dtype;
    ASSERT_TRUE(DTypeIsQuantized(embed));
    LoadedModel keep = *std::move(probe);
    EXPECT_THAT(Create(all, be.get(), &keep),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "backend 'no-quant' cannot run model.embed_tokens.weight stored as " +
                             std::string(DTypeName(embed))));
    // Only the layer matrices quantized: the first of them is named, with its own type.
    const std::string layers = Export(type, DType::kF32);
    probe = LoadModel(layers);
    ASSERT_TRUE(probe.ok()) << probe.status();
    EXPECT_EQ(probe->weights().embed_tokens.dtype, DType::kF32);
    const DType q = probe->weights().layers[0].q_proj.dtype;
    ASSERT_TRUE(DTypeIsQuantized(q));
    EXPECT_THAT(Create(layers, be.get(), &keep),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "backend 'no-quant' cannot run model.layers.0.self_attn.q_proj.weight "
                         "stored as " + std::string(DTypeName(q))));
  }
  // The wrapper itself runs the same model unquantized.
  LoadedModel keep = *LoadModel(kDemo);
  EXPECT_TRUE(Create(Export(DType::kF32), be.get(), &keep).ok());
}

TEST_F(QuantizedWeightsTest, EveryBackendRunsQ8_0OrRefusesIt) {
  const std::string path = Export(DType::kQ8_0);
  int ran = 0;
  for (const std::string& name : backend::CompiledBackends()) {
    SCOPED_TRACE(name);
    const std::vector<std::string> available = backend::AvailableBackends();
    if (std::find(available.begin(), available.end(), name) == available.end()) {
      std::printf("[quantized weights] backend %s: compiled in, no usable device here\n",
                  name.c_str());
      continue;
    }
    absl::StatusOr<std::unique_ptr<Backend>> be = backend::CreateBackend(name, {});
    ASSERT_TRUE(be.ok()) << be.status();
    const bool runs = (*be)->Supports(OpKind::kEmbed, DType::kQ8_0) &&
                      (*be)->Supports(OpKind::kGemm, DType::kQ8_0);
    be->reset();
    EngineOptions o;
    o.model_dir = path;
    o.backend = name;
    o.num_threads = 2;
    o.kv_cache_bytes = int64_t{16} << 20;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
    if (!runs) {
      EXPECT_THAT(engine.status(),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           "backend '" + name + "' cannot run model.embed_tokens.weight stored "
                           "as Q8_0"));
      std::printf("[quantized weights] backend %s refuses Q8_0: %s\n", name.c_str(),
                  std::string(engine.status().message()).c_str());
      ++ran;
      continue;
    }
    ASSERT_TRUE(engine.ok()) << engine.status();
    Request r;
    r.prompt = {1, 17, 42, 99};
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    r.sampling.max_new_tokens = 4;
    absl::StatusOr<std::vector<GenerationResult>> out = (*engine)->Generate({r});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].token_ids.size(), 4u);
    std::printf("[quantized weights] backend %s runs Q8_0\n", name.c_str());
    ++ran;
  }
  EXPECT_GE(ran, 1);  // the CPU backend at least
}

}  // namespace
}  // namespace modserve::engine
