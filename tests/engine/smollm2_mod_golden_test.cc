// The shipped MoD adapter (models/smollm2-mod over the SmolLM2-135M Q4_1 file) against the
// float64 PyTorch reference (tests/testdata/smollm2_mod/golden.json, made by make_golden.py
// there): 256 held-out tokens teacher-forced at the default request threshold and at 0.9, with
// per-layer capacities and thresholds. The engine's CPU Gemm rounds activations to 8 bits for
// quantized weights (DESIGN.md section 3.1) and the reference does not, so
//  - a few routing decisions may differ, each close to its threshold in the reference (bounds
//    below); a token that flipped follows another path from there, so its deeper layers are not
//    compared, and
//  - log-probabilities are held to the dense SmolLM2 golden's bounds (smollm2_golden.h) at the
//    default threshold, and to measured ones at 0.9.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/registry.h"
#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/model/config.h"
#include "engine/model/transformer.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/real_model.h"

namespace modserve::engine {
namespace {

using Json = nlohmann::json;

// Routing decisions that may differ: 8-bit activation rounding moves hidden states (the dense
// golden measures log-probabilities up to 0.57 apart), routers scaled to unit spread turn that
// into score differences, and a token routed differently changes the keys later tokens see. At
// the calibrated point (r = 0.9: 17% of 6,144 decisions skipped) 55 of 5,678 compared decisions
// (1%) differed, the largest at a reference margin |sigmoid(s) - tau_l| of 0.149; at the
// default, 1 at 0.004.
// The bounds are about twice that: a wrong threshold, router or combine flips whole layers.
constexpr double kRoutingMaxFlipMargin = 0.3;
constexpr double kRoutingMaxFlipRate = 0.02;
// Teacher-forced log-probabilities. At the default (shipped) point: the dense golden's bounds
// (smollm2_golden.h: twice what llama.cpp's own rounding costs). At r = 0.9 the model is far from
// dense (perplexity 3.4 times) and a token routed differently moves its prediction by nats, so
// only the mean and the perplexity are bounded there. That point is chaotic: the CPU kernel
// tables, which differ only in the order of their f32 additions, flip 53-55 decisions each and
// land at max 5.0-7.1, mean 0.27-0.30, perplexity +3.0% (avx2), +6.1% (avx512, avx512vnni) and
// +9.2% (scalar). The bounds are about twice the largest: a wrong threshold, router or combine
// skips or keeps whole layers, which moves the perplexity by tens of percent or more
// (tools/mod_oracle.py: +274% for whole layers at 27% skipped).
struct LogprobBounds {
  double max_abs, mean_abs, ppl_ratio;
};
constexpr LogprobBounds kAtDefault = {1.0, 0.12, 0.01};
constexpr LogprobBounds kAtCalibrated = {1e9, 0.6, 0.2};

const std::string kAdapter = std::string(MODSERVE_SOURCE_DIR) + "/models/smollm2-mod";
const std::string kGolden =
    std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/smollm2_mod/golden.json";

TEST(SmolLm2ModGoldenTest, AdapterMatchesReferenceUpToActivationRounding) {
  MODSERVE_REQUIRE_SMOLLM2(base);
  std::ifstream in(kGolden);
  const Json g = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(g.is_discarded()) << kGolden;
  const std::vector<int32_t> ids = g["ids"].get<std::vector<int32_t>>();

  absl::StatusOr<LoadedModel> m = LoadModel(kAdapter);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& cfg = m->config();
  ASSERT_TRUE(cfg.mod.has_value());
  EXPECT_EQ(m->tokenizer_path(), std::filesystem::path(base).lexically_normal().string());
  backend::BackendOptions bo;
  bo.num_threads = 2;
  auto be = backend::CreateBackend("cpu", bo);
  ASSERT_TRUE(be.ok()) << be.status();
  constexpr int32_t kBlock = 16;
  const int32_t pages = static_cast<int32_t>((ids.size() / kBlock + 2) * cfg.n_layers);
  auto kv = KvCacheManager::Create(
      pages, kBlock, static_cast<int32_t>(cfg.n_layers),
      KvCacheManager::BytesPerPage(static_cast<int32_t>(cfg.n_kv_heads), kBlock,
                                   static_cast<int32_t>(cfg.head_dim), DType::kF32));
  ASSERT_TRUE(kv.ok()) << kv.status();
  TransformerOptions to;
  to.max_batch_tokens = 512;
  to.max_seqs = 1;
  to.block_size = kBlock;
  to.num_pages = pages;
  auto tf = Transformer::Create(cfg, m->weights(), be->get(), kv->get(), to);
  ASSERT_TRUE(tf.ok()) << tf.status();

  const int64_t V = cfg.vocab_size;
  SequenceId seq = 1;
  for (const Json& c : g["cases"]) {
    const double r = c["threshold"].get<double>();
    SCOPED_TRACE(r);
    ASSERT_TRUE((*kv)->AddSequence(seq).ok());
    StepSequence s{seq, absl::MakeConstSpan(ids), 0, r, /*all_logits=*/true};
    absl::StatusOr<StepOutput> out = (*tf)->Step({s});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*kv)->Free(seq).ok());
    ++seq;

    // Routing: equal, but for near-ties of the reference. A token whose decision flipped at a
    // near-tie runs a different path from there on, so its deeper layers are not compared.
    int flips = 0, decisions = 0, parted = 0;
    double worst_flip = 0.0;
    std::vector<bool> path_parted(ids.size(), false);
    for (size_t k = 0; k < cfg.mod->routed_layers.size(); ++k) {
      const Json& want = c["routing"][std::to_string(cfg.mod->routed_layers[k])];
      EXPECT_NEAR(LayerThreshold(*cfg.mod, k, r), want["tau"].get<double>(), 1e-12);
      for (size_t p = 0; p < ids.size(); ++p) {
        if (path_parted[p]) {
          ++parted;
          continue;
        }
        ++decisions;
        if (out->selected[k][p] == want["selected"][p].get<int>()) continue;
        const double margin = want["margin"][p].get<double>();
        ++flips;
        path_parted[p] = true;
        worst_flip = std::max(worst_flip, margin);
        EXPECT_LT(margin, kRoutingMaxFlipMargin)
            << "layer " << cfg.mod->routed_layers[k] << " position " << p;
      }
    }
    // Log-probabilities of the next token.
    const auto ref = c["next_logprobs"].get<std::vector<double>>();
    ASSERT_EQ(ref.size(), ids.size() - 1);
    double max_abs = 0, sum_abs = 0, nll = 0, ref_nll = 0;
    for (size_t p = 0; p + 1 < ids.size(); ++p) {
      const float* row = out->logits.data() + p * V;
      const double mx = *std::max_element(row, row + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      const double lp = static_cast<double>(row[ids[p + 1]]) - mx - std::log(sum);
      max_abs = std::max(max_abs, std::abs(lp - ref[p]));
      sum_abs += std::abs(lp - ref[p]);
      nll -= lp;
      ref_nll -= ref[p];
    }
    const double n = static_cast<double>(ref.size());
    const double ppl = std::exp(nll / n), ref_ppl = std::exp(ref_nll / n);
    std::printf("[smollm2-mod r=%.2f] routing flips %d of %d compared decisions (largest "
                "reference margin %.4f; %d decisions after a flip not compared); |logprob - "
                "reference| max %.4f mean %.5f; perplexity %.4f vs %.4f\n",
                r, flips, decisions, worst_flip, parted, max_abs, sum_abs / n, ppl, ref_ppl);
    EXPECT_LE(flips, kRoutingMaxFlipRate * decisions);
    const LogprobBounds& b = r == cfg.mod->threshold ? kAtDefault : kAtCalibrated;
    EXPECT_LE(max_abs, b.max_abs);
    EXPECT_LE(sum_abs / n, b.mean_abs);
    EXPECT_NEAR(ppl / ref_ppl, 1.0, b.ppl_ratio);
  }
}

}  // namespace
}  // namespace modserve::engine
