// Engine facade behaviour that the goldens do not cover: ids the tokenizer cannot name (an
// embedding padded past it), a request failing on its own inside a shared step, injected faults,
// and Generate leaving nothing behind when it returns an error.
#include "engine/engine.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::engine {
namespace {

namespace fs = std::filesystem;
using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::ScratchDir;
using ::modserve::engine::testing::StatusIs;
using ::modserve::engine::testing::TestTensor;

const std::string kDemo = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";

// Every tensor of the checkpoint in `src`, as the test writer takes them.
std::vector<TestTensor> ReadTensors(const std::string& src) {
  auto ckpt = Checkpoint::Open(src);
  MODSERVE_CHECK(ckpt.ok()) << ckpt.status();
  std::vector<TestTensor> tensors;
  for (const std::string& name : ckpt->Names()) {
    const TensorView v = *ckpt->Get(name);
    tensors.push_back({name, std::string(DTypeName(v.dtype)),
                       std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim),
                       std::string(static_cast<const char*>(v.data), v.bytes())});
  }
  return tensors;
}

// models/demo with its embedding and LM head padded with zero rows to `vocab` ids (as
// checkpoints round vocab sizes up to a multiple of 64); the tokenizer keeps its 2048 tokens.
void WritePaddedDemo(const std::string& dir, int64_t vocab) {
  std::vector<TestTensor> tensors = ReadTensors(kDemo);
  for (TestTensor& t : tensors) {
    if (t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight") {
      t.bytes.resize(static_cast<size_t>(vocab) * (t.bytes.size() / t.shape[0]), '\0');
      t.shape[0] = vocab;
    }
  }
  testing::WriteSafetensors(dir + "/model.safetensors", tensors);
  std::ifstream in(kDemo + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["vocab_size"] = vocab;
  std::ofstream(dir + "/config.json") << config.dump(2);
  fs::copy_file(kDemo + "/tokenizer.json", dir + "/tokenizer.json");
}

std::unique_ptr<Engine> MakeEngine(const std::string& dir, const FaultInjection& faults = {},
                                   int32_t block_size = 16) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.num_threads = 1;
  eo.kv_cache_bytes = 8 << 20;
  eo.faults = faults;
  eo.block_size = block_size;
  auto e = Engine::Create(eo);
  MODSERVE_CHECK(e.ok()) << e.status();
  return *std::move(e);
}

Request Greedy(std::vector<TokenId> prompt, int32_t max_new_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_new_tokens = max_new_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

TEST(EngineTest, PaddedIdsAreRefusedInPromptsAndStopLists) {
  ScratchDir dir;
  WritePaddedDemo(dir.path(), 2112);
  std::unique_ptr<Engine> engine = MakeEngine(dir.path());
  EXPECT_EQ(engine->config().vocab_size, 2112);
  EXPECT_THAT(engine->Add(Greedy({1, 2100}, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, "token id 2100 names no token"));
  Request stop = Greedy({1, 17}, 4);
  stop.sampling.stop_token_ids = {2050};
  EXPECT_THAT(engine->Add(stop), StatusIs(absl::StatusCode::kInvalidArgument, "2050"));
  EXPECT_THAT(engine->Add(Greedy({1, 2112}, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the vocabulary"));
  EXPECT_EQ(engine->kv_stats().num_sequences, 0);
}

TEST(EngineTest, PaddedIdsAreNeverSampled) {
  // The padded rows of the LM head are zero, so their logit is 0: under a high temperature they
  // would take most of the mass whenever the real logits are negative. They name no token, so
  // the engine never samples them and every request detokenizes.
  ScratchDir dir;
  WritePaddedDemo(dir.path(), 2112);
  std::unique_ptr<Engine> engine = MakeEngine(dir.path());
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    Request r = Greedy({1, 40 + i, 7, 300 + i}, 48);
    r.sampling.temperature = 5.0f;
    r.sampling.seed = 100 + i;
    requests.push_back(r);
  }
  auto results = engine->Generate(requests);
  ASSERT_THAT(results, IsOk());
  for (const GenerationResult& r : *results) {
    ASSERT_EQ(r.token_ids.size(), 48u);
    for (TokenId t : r.token_ids) EXPECT_LT(t, 2048);
  }
  EXPECT_EQ(engine->kv_stats().num_used_pages, 0);
}

TEST(EngineTest, StepIsAtomicPerSequence) {
  // Two sequences sample in one step and the draw fails (injected) for exactly one of them: the
  // other advances exactly as it does alone; the failed one ends with its own error.
  std::unique_ptr<Engine> clean = MakeEngine(kDemo);
  const Request ra = Greedy({1, 50, 60}, 3), rb = Greedy({1, 70, 80, 90}, 3);
  auto alone = clean->Generate({rb});
  ASSERT_THAT(alone, IsOk());
  bool found = false;
  for (uint64_t seed = 0; seed < 64 && !found; ++seed) {
    FaultInjection faults;
    faults.sampler_rate = 0.5;
    faults.seed = seed;
    std::unique_ptr<Engine> engine = MakeEngine(kDemo, faults);
    auto a = engine->Add(ra);
    auto b = engine->Add(rb);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    auto step = engine->Step({{*a, 3}, {*b, 4}});
    ASSERT_THAT(step, IsOk());
    if (step->sequences[0].status.ok() || !step->sequences[1].status.ok()) continue;
    found = true;
    EXPECT_THAT(step->sequences[0].status,
                StatusIs(absl::StatusCode::kInternal, "injected sampler fault"));
    EXPECT_FALSE(step->sequences[0].event.has_value());
    EXPECT_TRUE(engine->Finished(*a));
    EXPECT_EQ(engine->PendingTokens(*a), 0);
    ASSERT_TRUE(step->sequences[1].event.has_value());
    EXPECT_EQ(step->sequences[1].event->token, (*alone)[0].token_ids[0]);
    EXPECT_FALSE(engine->Finished(*b));
    // The failed sequence's KV entries were committed with the step; Release frees them.
    EXPECT_GT(engine->HeldPages(*a), 0);
    ASSERT_THAT(engine->Release(*a), IsOk());
    ASSERT_THAT(engine->Release(*b), IsOk());
    EXPECT_EQ(engine->kv_stats().num_used_pages, 0);
  }
  EXPECT_TRUE(found) << "no seed failed exactly the first of two draws";
}

TEST(EngineTest, StepWithACallerBugFailsWholeAndCommitsNothing) {
  std::unique_ptr<Engine> engine = MakeEngine(kDemo);
  auto c = engine->Add(Greedy({1, 5}, 2));
  ASSERT_THAT(c, IsOk());
  EXPECT_THAT(engine->Step({{*c, 2}, {999, 1}}), StatusIs(absl::StatusCode::kNotFound, "999"));
  EXPECT_EQ(engine->PendingTokens(*c), 2);
  EXPECT_EQ(engine->HeldPages(*c), 0);
}

TEST(EngineTest, DetokenizerFaultFailsOnlyItsRequest) {
  FaultInjection faults;
  faults.detokenizer_rate = 0.2;
  faults.seed = 5;
  std::unique_ptr<Engine> engine = MakeEngine(kDemo, faults);
  std::vector<SequenceId> ids;
  for (int i = 0; i < 8; ++i) {
    auto id = engine->Add(Greedy({1, 30 + i, 31}, 12));
    ASSERT_THAT(id, IsOk());
    ids.push_back(*id);
  }
  int failed = 0, finished = 0;
  for (int iter = 0; iter < 64; ++iter) {
    std::vector<StepEntry> entries;
    for (SequenceId id : ids) {
      if (engine->PendingTokens(id) > 0) entries.push_back({id, engine->PendingTokens(id)});
    }
    if (entries.empty()) break;
    auto step = engine->Step(entries);
    ASSERT_THAT(step, IsOk());
    for (const SequenceStepResult& s : step->sequences) {
      if (!s.status.ok()) {
        EXPECT_THAT(s.status, StatusIs(absl::StatusCode::kInternal, "detokenizer"));
        ++failed;
      } else if (s.event && s.event->finish_reason) {
        ++finished;
      }
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(finished, 0);
  EXPECT_EQ(failed + finished, 8);
  for (SequenceId id : ids) ASSERT_THAT(engine->Release(id), IsOk());
  EXPECT_EQ(engine->kv_stats().num_used_pages, 0);
}

TEST(EngineTest, BackendFaultFailsTheStepAndCommitsNothing) {
  FaultInjection faults;
  faults.backend_fault_step = 2;
  std::unique_ptr<Engine> engine = MakeEngine(kDemo, faults);
  auto id = engine->Add(Greedy({1, 9, 9}, 4));
  ASSERT_THAT(id, IsOk());
  ASSERT_THAT(engine->Step({{*id, 3}}), IsOk());
  const int32_t pages = engine->HeldPages(*id);
  EXPECT_THAT(engine->Step({{*id, 1}}), StatusIs(absl::StatusCode::kInternal, "backend fault"));
  EXPECT_EQ(engine->HeldPages(*id), pages);
  EXPECT_EQ(engine->PendingTokens(*id), 1);
}

TEST(EngineTest, GenerateReleasesEverythingWhenARequestFails) {
  FaultInjection faults;
  faults.sampler_rate = 0.3;
  faults.seed = 3;
  std::unique_ptr<Engine> engine = MakeEngine(kDemo, faults);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(Greedy({1, 20 + i}, 16));
  EXPECT_THAT(engine->Generate(requests), StatusIs(absl::StatusCode::kInternal, "injected"));
  EXPECT_EQ(engine->kv_stats().num_sequences, 0);
  EXPECT_EQ(engine->kv_stats().num_used_pages, 0);
  // A request the engine refuses at Add ends the call the same way.
  std::vector<Request> bad = {Greedy({1, 2}, 4), Greedy({1, 5000}, 4)};
  EXPECT_THAT(engine->Generate(bad), StatusIs(absl::StatusCode::kInvalidArgument, "5000"));
  EXPECT_EQ(engine->kv_stats().num_sequences, 0);
}

TEST(EngineTest, ABiasMayHaveAnotherDtypeThanItsWeight) {
  // DESIGN.md allows mixed dtypes within a checkpoint. The F32 routers of this checkpoint get
  // BF16 biases (values rounded to BF16 first) in one copy and F32 biases holding the same
  // values in another: both load and compute the same logits and decisions.
  const std::string src =
      std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias";
  ScratchDir bf16_dir, f32_dir;
  std::vector<TestTensor> bf16 = ReadTensors(src), f32 = ReadTensors(src);
  int num_biases = 0;
  for (size_t i = 0; i < bf16.size(); ++i) {
    if (bf16[i].name.find("router.bias") == std::string::npos) continue;
    ASSERT_EQ(bf16[i].dtype, "F32");
    ++num_biases;
    std::string narrow, wide;
    for (size_t at = 0; at < f32[i].bytes.size(); at += 4) {
      float v;
      std::memcpy(&v, f32[i].bytes.data() + at, 4);
      const bf16_t b = F32ToBf16(v);
      const float back = Bf16ToF32(b);
      narrow.append(reinterpret_cast<const char*>(&b.bits), 2);
      wide.append(reinterpret_cast<const char*>(&back), 4);
    }
    bf16[i].dtype = "BF16";
    bf16[i].bytes = narrow;
    f32[i].bytes = wide;
  }
  ASSERT_GT(num_biases, 0);
  testing::WriteSafetensors(bf16_dir.File("model.safetensors"), bf16);
  testing::WriteSafetensors(f32_dir.File("model.safetensors"), f32);
  fs::copy_file(src + "/config.json", bf16_dir.File("config.json"));
  fs::copy_file(src + "/config.json", f32_dir.File("config.json"));
  std::unique_ptr<Engine> a = MakeEngine(bf16_dir.path());
  std::unique_ptr<Engine> b = MakeEngine(f32_dir.path());
  Request r = Greedy({1, 17, 42, 99, 5, 61}, 12);
  r.prompt_logprobs = 5;
  auto ra = a->Generate({r});
  auto rb = b->Generate({r});
  ASSERT_THAT(ra, IsOk());
  ASSERT_THAT(rb, IsOk());
  EXPECT_EQ((*ra)[0].token_ids, (*rb)[0].token_ids);
  EXPECT_EQ((*ra)[0].routing, (*rb)[0].routing);
  EXPECT_EQ((*ra)[0].logprobs, (*rb)[0].logprobs);
  for (size_t p = 1; p < r.prompt.size(); ++p) {
    EXPECT_EQ(*(*ra)[0].prompt_logprobs[p].logprob, *(*rb)[0].prompt_logprobs[p].logprob);
  }
}

TEST(EngineTest, AutoKvDtypeFollowsTheWeights) {
  EngineOptions eo;
  eo.num_threads = 1;
  eo.kv_cache_bytes = 8 << 20;
  eo.kv_dtype = std::nullopt;
  eo.model_dir = kDemo;  // BF16 weights
  auto bf16 = Engine::Create(eo);
  ASSERT_THAT(bf16, IsOk());
  EXPECT_EQ((*bf16)->kv_dtype(), DType::kBF16);
  EXPECT_EQ((*bf16)->kv_bytes_per_token_layer(), 2 * 2 * 32 * 2);
  eo.model_dir =
      std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias";
  auto f32 = Engine::Create(eo);  // F32 weights
  ASSERT_THAT(f32, IsOk());
  EXPECT_EQ((*f32)->kv_dtype(), DType::kF32);
  EXPECT_THAT(ParseKvDtype("bf16"), IsOk());
  EXPECT_EQ(*ParseKvDtype("f16"), DType::kF16);
  EXPECT_FALSE(ParseKvDtype("auto")->has_value());
  EXPECT_THAT(ParseKvDtype("int8"), StatusIs(absl::StatusCode::kInvalidArgument, "'int8'"));
}

TEST(EngineTest, FaultSpecsParseAndBadOnesNameThePart) {
  auto f = ParseFaultInjection("sampler=0.25,backend_step=7,seed=9");
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->sampler_rate, 0.25);
  EXPECT_EQ(f->detokenizer_rate, 0.0);
  EXPECT_EQ(f->backend_fault_step, 7);
  EXPECT_EQ(f->seed, 9u);
  EXPECT_THAT(ParseFaultInjection(""), IsOk());
  EXPECT_THAT(ParseFaultInjection("sampler=2"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'sampler=2'"));
  EXPECT_THAT(ParseFaultInjection("backend_step=0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "backend_step=0"));
  EXPECT_THAT(ParseFaultInjection("disk=1"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected sampler="));
}

TEST(EngineTest, PromptLogprobsArriveWithTheFirstTokenAndInTheResult) {
  std::unique_ptr<Engine> engine = MakeEngine(kDemo);
  Request r = Greedy({1, 50, 60, 70, 80}, 4);
  r.prompt_logprobs = 3;
  auto id = engine->Add(r);
  ASSERT_THAT(id, IsOk());
  // Prefill in two chunks: positions 0-1, then 2-4 (the last one samples).
  auto first = engine->Step({{*id, 2}});
  ASSERT_THAT(first, IsOk());
  EXPECT_FALSE(first->sequences[0].event.has_value());
  auto second = engine->Step({{*id, 3}});
  ASSERT_THAT(second, IsOk());
  ASSERT_TRUE(second->sequences[0].event.has_value());
  const std::vector<PromptLogprob>& lp = second->sequences[0].event->prompt_logprobs;
  ASSERT_EQ(lp.size(), 5u);
  EXPECT_EQ(lp[0].token, 1);
  EXPECT_FALSE(lp[0].logprob.has_value());
  EXPECT_TRUE(lp[0].top.empty());
  for (size_t p = 1; p < lp.size(); ++p) {
    EXPECT_EQ(lp[p].token, r.prompt[p]);
    ASSERT_TRUE(lp[p].logprob.has_value());
    EXPECT_LE(*lp[p].logprob, 0.0f);
    ASSERT_EQ(lp[p].top.size(), 3u);
    EXPECT_GE(lp[p].top[0].logprob, lp[p].top[1].logprob);
    EXPECT_GE(lp[p].top[0].logprob, *lp[p].logprob);
  }
  auto third = engine->Step({{*id, 1}});
  ASSERT_THAT(third, IsOk());
  ASSERT_TRUE(third->sequences[0].event.has_value());
  EXPECT_TRUE(third->sequences[0].event->prompt_logprobs.empty());  // only on the first token
  auto result = engine->Result(*id);
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->prompt_logprobs.size(), 5u);
  for (size_t p = 1; p < 5; ++p) EXPECT_EQ(*result->prompt_logprobs[p].logprob, *lp[p].logprob);
  // Preemption recomputes the KV entries but keeps the logprobs computed once.
  ASSERT_THAT(engine->Preempt(*id), IsOk());
  ASSERT_THAT(engine->Step({{*id, engine->PendingTokens(*id)}}), IsOk());
  auto after = engine->Result(*id);
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->prompt_logprobs.size(), 5u);
  EXPECT_THAT(engine->Add([] {
    Request bad = Greedy({1, 2}, 2);
    bad.prompt_logprobs = 21;
    return bad;
  }()), StatusIs(absl::StatusCode::kInvalidArgument, "prompt_logprobs 21"));
}

// The KV page size (--kv_block_size) is a memory-layout choice: on the CPU backend the attention
// reads every page run in place, and a key's score, the softmax tiles and the order in which
// values are summed do not depend on where pages begin, so tokens, routing and logprobs are the
// same bits for every block size. Prompts of 300 tokens cross the 256-key split of a row.
TEST(EngineTest, KvBlockSizeChangesNoTokenRoutingOrLogprob) {
  std::vector<Request> requests;
  for (int32_t salt = 0; salt < 3; ++salt) {
    std::vector<TokenId> prompt = {1};
    for (int32_t i = 1; i < 300 - 37 * salt; ++i) {
      prompt.push_back(static_cast<TokenId>(3 + (i * 31 + salt * 97) % 2000));
    }
    requests.push_back(Greedy(prompt, 24));
    requests.back().sampling.top_logprobs = 2;
  }
  std::vector<GenerationResult> want;
  for (int32_t block_size : {16, 64, 5, 128}) {
    auto got = MakeEngine(kDemo, {}, block_size)->Generate(requests);
    ASSERT_THAT(got, IsOk());
    ASSERT_EQ(got->size(), requests.size());
    if (want.empty()) {
      want = *got;
      for (const GenerationResult& r : want) {
        ASSERT_EQ(r.token_ids.size(), 24u);
        ASSERT_EQ(r.logprobs.size(), 24u);
      }
      continue;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string what =
          "block_size " + std::to_string(block_size) + " request " + std::to_string(i);
      EXPECT_NE((*got)[i].kv_pages, want[i].kv_pages) << what << ": the pages are another size";
      EXPECT_EQ((*got)[i].token_ids, want[i].token_ids) << what;
      EXPECT_EQ((*got)[i].routing, want[i].routing) << what;
      EXPECT_EQ((*got)[i].logprobs, want[i].logprobs) << what;
      ASSERT_EQ((*got)[i].top_logprobs.size(), want[i].top_logprobs.size()) << what;
      for (size_t t = 0; t < want[i].top_logprobs.size(); ++t) {
        ASSERT_EQ((*got)[i].top_logprobs[t].size(), want[i].top_logprobs[t].size()) << what;
        for (size_t j = 0; j < want[i].top_logprobs[t].size(); ++j) {
          EXPECT_EQ((*got)[i].top_logprobs[t][j].id, want[i].top_logprobs[t][j].id) << what;
          EXPECT_EQ((*got)[i].top_logprobs[t][j].logprob, want[i].top_logprobs[t][j].logprob)
              << what;
        }
      }
    }
  }
}

// A page size below 1 is refused by name, whatever the cache size (with a cache of 2 GiB or more
// it used to surface as "more KV slots than 2^31").
TEST(EngineTest, KvBlockSizeBelowOneIsInvalidArgumentNamingIt) {
  for (int32_t block_size : {0, -16}) {
    for (int64_t cache_bytes : {int64_t{16} << 20, int64_t{4} << 30}) {
      EngineOptions eo;
      eo.model_dir = kDemo;
      eo.num_threads = 1;
      eo.block_size = block_size;
      eo.kv_cache_bytes = cache_bytes;
      EXPECT_THAT(Engine::Create(eo).status(),
                  StatusIs(absl::StatusCode::kInvalidArgument, "block_size"))
          << block_size << " " << cache_bytes;
    }
  }
}

}  // namespace
}  // namespace modserve::engine
