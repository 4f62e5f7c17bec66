// The device step (DESIGN.md section 5.2: routed rows and their KV slots found on the device, the
// routed block run under a device row count) against the host step, on the CPU backend, which
// runs both: same logits, decisions and probabilities bit for bit, and the same KV cache after
// every step, over every router configuration of the test checkpoints, mixed prefill and decode
// steps, several request thresholds, shared prefix pages and a pool too small for the device
// step's up-front reservation.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/model/transformer.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kBlockSize = 4;  // small pages: steps cross page boundaries often

// One model run by one transformer over its own KV cache.
struct Runner {
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<KvCacheManager> kv;
  std::unique_ptr<Transformer> transformer;

  static std::unique_ptr<Runner> Make(const LoadedModel& model, DeviceRouting routing,
                                      int32_t pages, bool prefix_cache,
                                      DeviceRouting graphs = DeviceRouting::kOff) {
    auto r = std::make_unique<Runner>();
    auto be = backend::cpu::CpuBackend::Create({.num_threads = 2});
    EXPECT_TRUE(be.ok()) << be.status();
    if (!be.ok()) return nullptr;
    r->backend = *std::move(be);
    const ModelConfig& cfg = model.config();
    r->kv = *KvCacheManager::Create(
        pages, kBlockSize, static_cast<int32_t>(cfg.n_layers),
        KvCacheManager::BytesPerPage(static_cast<int32_t>(cfg.n_kv_heads), kBlockSize,
                                     static_cast<int32_t>(cfg.head_dim), DType::kBF16));
    if (prefix_cache) r->kv->EnablePrefixCache();
    TransformerOptions opts;
    opts.max_batch_tokens = 96;
    opts.max_seqs = 6;
    opts.block_size = kBlockSize;
    opts.num_pages = pages;
    opts.kv_dtype = DType::kBF16;
    opts.device_routing = routing;
    opts.graphs = graphs;
    auto t = Transformer::Create(cfg, model.weights(), r->backend.get(), r->kv.get(), opts);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return nullptr;
    r->transformer = *std::move(t);
    return r;
  }
};

std::vector<std::string> Checkpoints() {
  std::vector<std::string> dirs = {(fs::path(MODSERVE_SOURCE_DIR) / "models" / "demo").string()};
  const fs::path root = fs::path(MODSERVE_SOURCE_DIR) / "tests" / "testdata" / "checkpoints";
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

void ExpectSameKv(const KvCacheManager& a, const KvCacheManager& b, const std::string& what) {
  const KvCacheStats sa = a.GetStats(), sb = b.GetStats();
  EXPECT_EQ(sa.num_used_pages, sb.num_used_pages) << what;
  EXPECT_EQ(sa.used_pages_per_layer, sb.used_pages_per_layer) << what;
  EXPECT_EQ(sa.tokens_per_layer, sb.tokens_per_layer) << what;
  EXPECT_EQ(sa.num_prefix_cache_pages, sb.num_prefix_cache_pages) << what;
}

void ExpectSameOutput(const StepOutput& got, const StepOutput& want, const std::string& what) {
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  // Bit for bit: both run the same ops on the same rows.
  EXPECT_TRUE(std::equal(got.logits.begin(), got.logits.end(), want.logits.begin())) << what;
  EXPECT_EQ(got.logit_offsets, want.logit_offsets) << what;
  EXPECT_EQ(got.row_offsets, want.row_offsets) << what;
  EXPECT_EQ(got.selected, want.selected) << what;
  EXPECT_EQ(got.probs, want.probs) << what;
  EXPECT_EQ(got.num_layer_skips, want.num_layer_skips) << what;
}

// Runs one step on both, checks they agree, and returns the host step's output.
StepOutput StepBoth(Runner& host, Runner& dev, absl::Span<const StepSequence> batch,
                    const std::string& what) {
  auto want = host.transformer->Step(batch);
  auto got = dev.transformer->Step(batch);
  EXPECT_TRUE(want.ok()) << what << ": " << want.status();
  EXPECT_TRUE(got.ok()) << what << ": " << got.status();
  if (!want.ok() || !got.ok()) return {};
  ExpectSameOutput(*got, *want, what);
  ExpectSameKv(*dev.kv, *host.kv, what);
  return *std::move(want);
}

// The greedy token of the last logit row of the i-th sequence of a step.
int32_t Greedy(const StepOutput& out, size_t i, int32_t vocab) {
  const float* row = out.logits.data() + int64_t{out.logit_offsets[i + 1] - 1} * vocab;
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

class DeviceStepTest : public ::testing::TestWithParam<std::string> {};

// Three sequences: prefill chunks of different lengths and thresholds, then decode steps in
// which one sequence asks for all logits and another leaves; the greedy token of each step is
// fed back, so a difference anywhere would show in every later step too.
TEST_P(DeviceStepTest, MatchesTheHostStepBitForBit) {
  auto model = LoadModel(GetParam());
  ASSERT_TRUE(model.ok()) << model.status();
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  auto host = Runner::Make(*model, DeviceRouting::kOff, 400, false);
  auto dev = Runner::Make(*model, DeviceRouting::kOn, 400, false);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(dev, nullptr);
  // Thresholds of every kind: f32 values (0.5, 0.25, 0.75) and one that is not (0.3); with
  // per-layer calibrated thresholds (two of the checkpoints) no tau_l is an f32 value.
  const double taus[] = {0.5, 0.25, 0.75};
  std::vector<std::vector<int32_t>> tokens = {{}, {}, {}};
  const int lens[] = {13, 1, 22};
  for (int s = 0; s < 3; ++s) {
    for (int t = 0; t < lens[s]; ++t) tokens[s].push_back((s * 31 + t * 7 + 3) % vocab);
    ASSERT_TRUE(host->kv->AddSequence(s).ok());
    ASSERT_TRUE(dev->kv->AddSequence(s).ok());
  }
  std::vector<int32_t> fed = {0, 0, 0};
  int64_t device_steps = 0;
  for (int step = 0; step < 12; ++step) {
    std::vector<StepSequence> batch;
    for (int s = 0; s < 3; ++s) {
      if (s == 1 && step >= 8) continue;  // sequence 1 stops
      StepSequence q;
      q.seq_id = s;
      // Prefill in chunks of 5 tokens, then one token per step.
      const int32_t n = std::min<int32_t>(5, static_cast<int32_t>(tokens[s].size()) - fed[s]);
      q.tokens = absl::MakeConstSpan(tokens[s]).subspan(fed[s], std::max(n, 1));
      q.start_pos = fed[s];
      q.threshold = step == 6 ? 0.3 : taus[s];
      q.all_logits = s == 2 && step % 3 == 0;
      batch.push_back(q);
    }
    const std::string what = GetParam() + " step " + std::to_string(step);
    ++device_steps;
    const StepOutput want = StepBoth(*host, *dev, batch, what);
    ASSERT_FALSE(HasFailure()) << what;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int s = static_cast<int>(batch[i].seq_id);
      fed[s] += static_cast<int32_t>(batch[i].tokens.size());
      // Greedy continuation once the prompt is fed.
      if (fed[s] >= static_cast<int32_t>(tokens[s].size())) {
        tokens[s].push_back(Greedy(want, i, vocab));
      }
    }
  }
  EXPECT_EQ(host->transformer->num_device_steps(), 0);
  EXPECT_EQ(dev->transformer->num_device_steps(), device_steps);
}

// Prefix caching: a second sequence attaches the first one's cached blocks and appends to a
// shared partial page (copy-on-write before the device step's reservation is used).
TEST_P(DeviceStepTest, SharedPrefixPagesMatchTheHostStep) {
  auto model = LoadModel(GetParam());
  ASSERT_TRUE(model.ok()) << model.status();
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  auto host = Runner::Make(*model, DeviceRouting::kOff, 400, true);
  auto dev = Runner::Make(*model, DeviceRouting::kOn, 400, true);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(dev, nullptr);
  const int n_layers = static_cast<int>(model->config().n_layers);
  const int num_routed =
      model->config().mod ? static_cast<int>(model->config().mod->routed_layers.size()) : 0;
  std::vector<int32_t> prompt;
  for (int t = 0; t < 10; ++t) prompt.push_back((t * 5 + 1) % vocab);
  const ModelConfig& cfg = model->config();
  for (Runner* r : {host.get(), dev.get()}) {
    ASSERT_TRUE(r->kv->AddSequence(1).ok());
    StepSequence q{.seq_id = 1, .tokens = prompt, .start_pos = 0, .threshold = 0.5};
    auto first = r->transformer->Step({&q, 1});
    ASSERT_TRUE(first.ok()) << first.status();
    // Cache the first two full blocks with the entries each layer holds for their tokens.
    uint64_t parent = 0;
    for (int b = 0; b < 2; ++b) {
      std::vector<int32_t> counts(n_layers, (b + 1) * kBlockSize);
      for (size_t k = 0; cfg.mod && k < cfg.mod->routed_layers.size(); ++k) {
        const auto& sel = first->selected[k];
        counts[cfg.mod->routed_layers[k]] = static_cast<int32_t>(
            std::count(sel.begin(), sel.begin() + (b + 1) * kBlockSize, uint8_t{1}));
      }
      auto key = r->kv->CacheBlock(
          1, parent, absl::MakeConstSpan(prompt).subspan(b * kBlockSize, kBlockSize), 0, counts,
          {});
      ASSERT_TRUE(key.ok()) << key.status();
      parent = *key;
    }
    ASSERT_TRUE(r->kv->AddSequence(2).ok());
    auto attached = r->kv->AttachCachedPrefix(2, prompt, 0);
    ASSERT_TRUE(attached.ok()) << attached.status();
    ASSERT_EQ(attached->size(), 2u);
  }
  std::vector<int32_t> tail = {prompt.begin() + 2 * kBlockSize, prompt.end()};
  std::vector<int32_t> fed = {2 * kBlockSize};
  for (int step = 0; step < 6; ++step) {
    StepSequence q{.seq_id = 2,
                   .tokens = absl::MakeConstSpan(tail).subspan(step == 0 ? 0 : tail.size() - 1),
                   .start_pos = fed[0],
                   .threshold = 0.5};
    const std::string what = GetParam() + " shared step " + std::to_string(step);
    auto want = host->transformer->Step({&q, 1});
    auto got = dev->transformer->Step({&q, 1});
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    ExpectSameOutput(*got, *want, what);
    // The same entries. Pages: the device step reserves a slot at every routed layer before it
    // knows the routing, so a routed layer whose tail page is shared gets its private copy even
    // when the token then skips the layer; at most one page per routed layer more, once.
    const KvCacheStats sd = dev->kv->GetStats(), sh = host->kv->GetStats();
    EXPECT_EQ(sd.tokens_per_layer, sh.tokens_per_layer) << what;
    EXPECT_GE(sd.num_used_pages, sh.num_used_pages) << what;
    EXPECT_LE(sd.num_used_pages, sh.num_used_pages + num_routed) << what;
    fed[0] += static_cast<int32_t>(q.tokens.size());
    const float* row = want->logits.data() + (want->logits.size() / vocab - 1) * vocab;
    tail.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
  }
  EXPECT_EQ(dev->transformer->num_device_steps(), 7);
}

// Graphs (the CPU backend records and replays the ops): decode steps of 1 to 5 sequences (buckets
// 1, 2, 4 and 8) over contexts that cross page-table strides, with a long prompt that asks for
// every logit in between (the logits buffer grows, which drops the graphs), against the host
// step.
TEST_P(DeviceStepTest, GraphReplaysMatchTheHostStepBitForBit) {
  auto model = LoadModel(GetParam());
  ASSERT_TRUE(model.ok()) << model.status();
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  auto host = Runner::Make(*model, DeviceRouting::kOff, 600, false);
  auto dev = Runner::Make(*model, DeviceRouting::kOn, 600, false, DeviceRouting::kOn);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(dev, nullptr);
  constexpr int kSeqs = 5;
  std::vector<std::vector<int32_t>> tokens(kSeqs + 1);
  std::vector<int32_t> fed(kSeqs + 1, 0);
  auto run = [&](std::vector<StepSequence> batch, const std::string& what) {
    const StepOutput want = StepBoth(*host, *dev, batch, what);
    for (size_t i = 0; !HasFailure() && i < batch.size(); ++i) {
      const int s = static_cast<int>(batch[i].seq_id);
      fed[s] += static_cast<int32_t>(batch[i].tokens.size());
      tokens[s].push_back(Greedy(want, i, vocab));
    }
  };
  for (int s = 0; s <= kSeqs; ++s) {
    ASSERT_TRUE(host->kv->AddSequence(s).ok());
    ASSERT_TRUE(dev->kv->AddSequence(s).ok());
  }
  for (int s = 0; s < kSeqs; ++s) {  // prompts of 3 to 15 tokens, one prefill step each
    for (int t = 0; t < 3 + 3 * s; ++t) tokens[s].push_back((s * 17 + t * 11 + 5) % vocab);
    run({StepSequence{.seq_id = s, .tokens = tokens[s], .start_pos = 0, .threshold = 0.5}},
        "prefill " + std::to_string(s));
    ASSERT_FALSE(HasFailure());
  }
  int64_t decode_steps = 0;
  for (int step = 0; step < 24; ++step) {
    if (step == 12) {  // 40 prompt tokens, every logit: more rows than the logits buffer holds
      for (int t = 0; t < 40; ++t) tokens[kSeqs].push_back((t * 13 + 1) % vocab);
      run({StepSequence{.seq_id = kSeqs, .tokens = tokens[kSeqs], .start_pos = 0,
                        .threshold = 0.5, .all_logits = true}},
          "long prompt");
      tokens[kSeqs].pop_back();
    }
    std::vector<StepSequence> batch;
    const int active = step % kSeqs + 1;
    for (int s = 0; s < active; ++s) {
      batch.push_back({.seq_id = s,
                       .tokens = absl::MakeConstSpan(tokens[s]).subspan(fed[s], 1),
                       .start_pos = fed[s],
                       .threshold = 0.5});
    }
    ++decode_steps;
    run(batch, GetParam() + " decode step " + std::to_string(step));
    ASSERT_FALSE(HasFailure());
  }
  // Each shape's first decode step ran eagerly, every later one as a replay; shapes were captured
  // at their second step, and again after the drop.
  const Transformer& t = *dev->transformer;
  EXPECT_EQ(t.num_graph_warmups() + t.num_graph_replays(), decode_steps);
  EXPECT_GE(t.num_graph_captures(), 4);
  EXPECT_LE(t.num_graph_captures(), t.num_graph_warmups());
  EXPECT_GE(t.num_graph_replays(), t.num_graph_captures());  // a capture is replayed at once
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, DeviceStepTest, ::testing::ValuesIn(Checkpoints()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = fs::path(info.param).filename().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

// A pool that holds what the routed tokens need but not a slot for every candidate at every
// routed layer: the device step gives its reservation back and the host step runs.
TEST(DeviceStepFallbackTest, TooSmallAPoolFallsBackToTheHostStep) {
  auto model = LoadModel((fs::path(MODSERVE_SOURCE_DIR) / "models" / "demo").string());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& cfg = model->config();
  ASSERT_TRUE(cfg.mod.has_value());
  std::vector<int32_t> prompt;
  for (int t = 0; t < 40; ++t) prompt.push_back((t * 3 + 2) % static_cast<int32_t>(cfg.vocab_size));
  // Pages for every layer's 40 entries: what the device step reserves up front, less one.
  const int32_t all = static_cast<int32_t>(cfg.n_layers) * (40 / kBlockSize);
  auto host = Runner::Make(*model, DeviceRouting::kOff, all - 1, false);
  auto dev = Runner::Make(*model, DeviceRouting::kOn, all - 1, false);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(dev, nullptr);
  StepSequence q{.seq_id = 1, .tokens = prompt, .start_pos = 0, .threshold = 0.5};
  ASSERT_TRUE(host->kv->AddSequence(1).ok());
  ASSERT_TRUE(dev->kv->AddSequence(1).ok());
  auto want = host->transformer->Step({&q, 1});
  ASSERT_TRUE(want.ok()) << want.status() << " (the routed layers must not route every token in)";
  auto got = dev->transformer->Step({&q, 1});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(dev->transformer->num_device_steps(), 0);
  ExpectSameOutput(*got, *want, "fallback");
  ExpectSameKv(*dev->kv, *host->kv, "fallback");
}

}  // namespace
}  // namespace modserve::engine
