// Integration tests of the gRPC edge on a real loopback channel to an in-process server over a
// tiny MoD checkpoint: equality with offline generation, batch invariance under concurrency,
// cancellation and deadlines freeing KV pages, queue limits, request validation, and an engine
// failure ending requests with INTERNAL.
#include "server/server.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/checkpoint_test_util.h"
#include "tests/server/engine_gate.h"

namespace modserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char kCheckpoint[] =
    MODSERVE_SOURCE_DIR "/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias";
const char kTokenizer[] = MODSERVE_SOURCE_DIR "/tests/testdata/tokenizer/demo/tokenizer.json";
constexpr int kMaxSeqLen = 512;  // the checkpoint's max_position_embeddings

using Gate = testing::EngineGate;

engine::EngineOptions EngineOpts(const std::string& model_dir,
                                 int64_t kv_cache_bytes = int64_t{16} << 20) {
  engine::EngineOptions eo;
  eo.model_dir = model_dir;
  eo.num_threads = 1;
  eo.max_seqs = 16;
  eo.max_batch_tokens = 64;
  eo.kv_cache_bytes = kv_cache_bytes;
  return eo;
}

struct Harness {
  explicit Harness(const std::string& model_dir = kCheckpoint, int32_t max_queue = 64,
                   int32_t max_num_seqs = 16, int64_t kv_cache_bytes = int64_t{16} << 20,
                   absl::Duration drain_timeout = absl::Seconds(30), int32_t stream_interval = 1,
                   const engine::FaultInjection& faults = {}) {
    ServerOptions so;
    so.drain_timeout = drain_timeout;
    so.stream_interval = stream_interval;
    so.loop.scheduler.max_num_seqs = max_num_seqs;
    so.loop.scheduler.max_batch_tokens = 64;
    so.loop.scheduler.max_queue = max_queue;
    so.loop.before_iteration = [this] { gate.Pass(); };
    engine::EngineOptions eo = EngineOpts(model_dir, kv_cache_bytes);
    eo.faults = faults;
    auto s = Server::Start(so, eo);
    MODSERVE_CHECK(s.ok()) << s.status();
    server = *std::move(s);
    channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                  grpc::InsecureChannelCredentials());
    stub = v1::ModServe::NewStub(channel);
  }
  ~Harness() {
    gate.Open();
    server->Shutdown();
  }

  Gate gate;
  std::unique_ptr<Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ModServe::Stub> stub;
};

v1::GenerateRequest TokenRequest(std::vector<int32_t> prompt, int32_t max_new_tokens) {
  v1::GenerateRequest r;
  r.mutable_prompt_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(d));
}

grpc::Status Unary(v1::ModServe::Stub& stub, const v1::GenerateRequest& req,
                   v1::GenerateResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  return stub.Generate(&ctx, req, resp);
}

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::string text;
  v1::GenerateStreamResponse last;
  int num_messages = 0;
};

Streamed Stream(v1::ModServe::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  Streamed out;
  auto reader = stub.GenerateStream(&ctx, req);
  v1::GenerateStreamResponse msg;
  while (reader->Read(&msg)) {
    ++out.num_messages;
    out.token_ids.insert(out.token_ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    for (const auto& lp : msg.logprobs()) out.logprobs.push_back(lp.logprob());
    out.text += msg.text();
    out.last = msg;
  }
  out.status = reader->Finish();
  return out;
}

// What the offline path (Engine::Generate, as modserve-generate runs it) gives.
engine::GenerationResult Offline(const std::string& model_dir, const v1::GenerateRequest& req) {
  engine::EngineOptions eo = EngineOpts(model_dir);
  eo.max_seqs = 1;
  auto e = engine::Engine::Create(eo);
  MODSERVE_CHECK(e.ok()) << e.status();
  engine::Request r;
  r.prompt.assign(req.prompt_token_ids().ids().begin(), req.prompt_token_ids().ids().end());
  r.sampling.max_new_tokens = req.stopping().max_new_tokens();
  r.sampling.ignore_eos = req.stopping().ignore_eos();
  r.sampling.temperature = req.sampling().has_temperature() ? req.sampling().temperature() : 0.0f;
  if (req.sampling().has_top_k()) r.sampling.top_k = req.sampling().top_k();
  if (req.sampling().has_seed()) r.sampling.seed = req.sampling().seed();
  auto out = (*e)->Generate({r});
  MODSERVE_CHECK(out.ok()) << out.status();
  return (*out)[0];
}

std::vector<int32_t> Ids(const google::protobuf::RepeatedField<int32_t>& ids) {
  return {ids.begin(), ids.end()};
}

TEST(ServerTest, UnaryAndStreamEqualOfflineGeneration) {
  Harness h;
  v1::GenerateRequest greedy = TokenRequest({1, 17, 42, 99, 5}, 12);
  v1::GenerateRequest sampled = TokenRequest({1, 7, 7, 130, 64, 3}, 20);
  sampled.mutable_sampling()->set_temperature(0.9f);
  sampled.mutable_sampling()->set_top_k(40);
  sampled.mutable_sampling()->set_seed(1234);
  for (const v1::GenerateRequest& req : {greedy, sampled}) {
    const engine::GenerationResult want = Offline(kCheckpoint, req);
    v1::GenerateResponse unary;
    ASSERT_TRUE(Unary(*h.stub, req, &unary).ok());
    EXPECT_EQ(Ids(unary.token_ids()), want.token_ids);
    ASSERT_EQ(unary.logprobs_size(), static_cast<int>(want.logprobs.size()));
    for (int i = 0; i < unary.logprobs_size(); ++i) {
      EXPECT_EQ(unary.logprobs(i).logprob(), want.logprobs[i]) << "token " << i;
    }
    EXPECT_EQ(unary.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(unary.usage().prompt_tokens(), req.prompt_token_ids().ids_size());
    EXPECT_EQ(unary.usage().completion_tokens(), req.stopping().max_new_tokens());
    // The routing summary restates the engine's per-token decisions.
    ASSERT_EQ(unary.routing().layers_size(), static_cast<int>(want.routed_layers.size()));
    for (int k = 0; k < unary.routing().layers_size(); ++k) {
      int64_t computed = 0;
      for (uint8_t d : want.routing[k]) computed += d;
      EXPECT_EQ(unary.routing().layers(k).tokens_computed(), computed);
      EXPECT_EQ(unary.routing().layers(k).tokens_total(),
                static_cast<int64_t>(want.routing[k].size()));
    }
    EXPECT_EQ(unary.routing().kv_bytes(), want.kv_bytes);
    EXPECT_EQ(unary.routing().kv_bytes_dense(), want.kv_bytes_dense);

    Streamed s = Stream(*h.stub, req);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.token_ids, want.token_ids);
    EXPECT_EQ(s.logprobs, want.logprobs);
    EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(s.last.usage().completion_tokens(), req.stopping().max_new_tokens());
  }
}

TEST(ServerTest, StreamedTextEqualsUnaryTextWithMultiByteUtf8) {
  // The checkpoint plus a byte-level BPE tokenizer: ids above 100 are single bytes >= 0x80, so
  // sampled text is full of multi-byte characters that streaming must never split.
  engine::testing::ScratchDir scratch;
  const std::filesystem::path dir(scratch.path());
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::create_symlink(std::filesystem::path(kCheckpoint) / f, dir / f);
  }
  std::filesystem::create_symlink(kTokenizer, dir / "tokenizer.json");
  Harness h(dir.string());
  for (uint64_t seed : {1, 2, 3}) {
    v1::GenerateRequest req = TokenRequest({1, 120, 130, 140, 150}, 40);
    req.mutable_sampling()->set_temperature(1.0f);
    req.mutable_sampling()->set_seed(seed);
    v1::GenerateResponse unary;
    ASSERT_TRUE(Unary(*h.stub, req, &unary).ok());
    EXPECT_TRUE(std::any_of(unary.text().begin(), unary.text().end(),
                            [](char c) { return static_cast<unsigned char>(c) >= 0x80; }))
        << "the test needs multi-byte output; got '" << unary.text() << "'";
    const engine::GenerationResult want = Offline(dir.string(), req);
    EXPECT_EQ(unary.text(), want.text);
    Streamed s = Stream(*h.stub, req);
    ASSERT_TRUE(s.status.ok());
    EXPECT_EQ(s.text, unary.text());
  }
}

TEST(ServerTest, ConcurrentSeededStreamsEqualTheSameRequestsOneAtATime) {
  Harness h;
  constexpr int kNumStreams = 16;
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < kNumStreams; ++i) {
    v1::GenerateRequest r = TokenRequest({1, 3 + i, 50 + 2 * i, 9, 100 + i}, 16 + i % 5);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(0.9f);
    r.mutable_sampling()->set_seed(1000 + i);
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone(kNumStreams);
  for (int i = 0; i < kNumStreams; ++i) {
    v1::GenerateResponse resp;
    ASSERT_TRUE(Unary(*h.stub, reqs[i], &resp).ok());
    alone[i] = Ids(resp.token_ids());
  }
  // Hold the engine until all 16 are queued, so they really share steps.
  h.gate.CloseAndWait();
  std::vector<Streamed> together(kNumStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kNumStreams; ++i) {
    threads.emplace_back([&, i] { together[i] = Stream(*h.stub, reqs[i]); });
  }
  while (h.server->loop().num_in_flight() < kNumStreams) std::this_thread::yield();
  h.gate.Open();
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kNumStreams; ++i) {
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].token_ids, alone[i]) << "stream " << i;
  }
}

TEST(ServerTest, PreemptedSequencesRecomputeToTheSameTokens) {
  // 16 pages of 16 tokens x 2 KV heads x 12 x (K, V) x f32 = 3072 bytes. A 5 + 40 token sequence
  // is admitted at an expected 8 pages (2 dense layers x 3 + 2 routed layers x 1 at the prior
  // capacity 0.25), but this checkpoint routes 30-80% of tokens in, so it holds about 11: two
  // admitted together run out of pages and one is preempted. Alone, each fits (<= 12 pages).
  Harness h(kCheckpoint, 64, 16, /*kv_cache_bytes=*/16 * 3072);
  constexpr int kNumRequests = 6;
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < kNumRequests; ++i) {
    v1::GenerateRequest r = TokenRequest({1, 3 + i, 50 + 2 * i, 9, 100 + i}, 40);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_seed(77 + i);
    r.mutable_routing()->set_return_decisions(true);
    reqs.push_back(r);
  }
  h.gate.CloseAndWait();
  std::vector<Streamed> together(kNumRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kNumRequests; ++i) {
    threads.emplace_back([&, i] { together[i] = Stream(*h.stub, reqs[i]); });
  }
  while (h.server->loop().num_in_flight() < kNumRequests) std::this_thread::yield();
  h.gate.Open();
  for (std::thread& t : threads) t.join();
  // Together first, while the estimate is still the prior (it learns the real fraction).
  const int64_t num_preemptions = h.server->loop().num_preemptions();
  EXPECT_GT(num_preemptions, 0);
  std::vector<v1::GenerateResponse> alone(kNumRequests);
  for (int i = 0; i < kNumRequests; ++i) ASSERT_TRUE(Unary(*h.stub, reqs[i], &alone[i]).ok());
  EXPECT_EQ(h.server->loop().num_preemptions(), num_preemptions);  // alone, each fits
  for (int i = 0; i < kNumRequests; ++i) {
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].token_ids, Ids(alone[i].token_ids())) << "request " << i;
    // The recomputed prefix routes exactly as the first time: same decisions at every layer.
    const v1::RoutingSummary& got = together[i].last.routing();
    const v1::RoutingSummary& want = alone[i].routing();
    ASSERT_EQ(got.layers_size(), want.layers_size());
    for (int k = 0; k < want.layers_size(); ++k) {
      EXPECT_EQ(got.layers(k).decisions(), want.layers(k).decisions())
          << "request " << i << " layer " << want.layers(k).layer();
      EXPECT_EQ(got.layers(k).decisions().size(), 5u + 40u - 1u);
    }
  }
  ASSERT_TRUE(h.server->loop().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(h.server->loop().kv_used_pages(), 0);
}

// --stream_interval 4: the first token goes out without waiting for more (time to first token
// is not held back), later messages carry at least 4 tokens (more when a write was still in
// flight), the last one the remainder and the summary; the tokens are the same as unary's.
// The engine is held after the prefill step, so the first message can only hold its one token.
TEST(ServerTest, StreamIntervalBatchesTokensAfterTheFirst) {
  Harness h(kCheckpoint, 64, 16, int64_t{16} << 20, absl::Seconds(30), /*stream_interval=*/4);
  const v1::GenerateRequest req = TokenRequest({3, 1, 4, 1, 5}, 23);
  v1::GenerateResponse unary;
  ASSERT_TRUE(Unary(*h.stub, req, &unary).ok());
  h.gate.CloseAndWait();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  auto reader = h.stub->GenerateStream(&ctx, req);
  while (h.server->loop().num_in_flight() < 1) std::this_thread::yield();
  h.gate.StepOnce();  // takes the request in and runs its prefill, which samples one token
  std::vector<int> sizes;
  std::vector<int32_t> tokens;
  v1::GenerateStreamResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  sizes.push_back(msg.token_ids_size());
  tokens.insert(tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
  h.gate.Open();
  while (reader->Read(&msg)) {
    sizes.push_back(msg.token_ids_size());
    tokens.insert(tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, Ids(unary.token_ids()));
  ASSERT_GE(sizes.size(), 2u);
  EXPECT_EQ(sizes.front(), 1);
  for (size_t i = 1; i + 1 < sizes.size(); ++i) EXPECT_GE(sizes[i], 4) << "message " << i;
  EXPECT_LE(sizes.size(), 1u + (23 - 1 + 3) / 4);  // 1 + ceil(22 / 4)
  EXPECT_EQ(msg.usage().completion_tokens(), 23);
}

TEST(ServerTest, CancelledStreamLeavesNoKvPagesInUse) {
  Harness h;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  auto reader = h.stub->GenerateStream(&ctx, TokenRequest({1, 2, 3, 4, 5, 6, 7, 8}, 480));
  v1::GenerateStreamResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  h.gate.CloseAndWait();  // mid-way: the engine holds the sequence's pages
  EXPECT_GT(h.server->loop().kv_used_pages(), 0);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  h.gate.Open();
  ASSERT_TRUE(h.server->loop().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(h.server->loop().kv_used_pages(), 0);
}

TEST(ServerTest, RequestPastItsDeadlineLeavesNoKvPagesInUse) {
  Harness h;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Milliseconds(300));
  auto reader = h.stub->GenerateStream(&ctx, TokenRequest({1, 2, 3, 4, 5, 6, 7, 8}, 480));
  v1::GenerateStreamResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  h.gate.CloseAndWait();
  EXPECT_GT(h.server->loop().kv_used_pages(), 0);
  while (reader->Read(&msg)) {  // returns once the deadline passes
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  h.gate.Open();
  ASSERT_TRUE(h.server->loop().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(h.server->loop().kv_used_pages(), 0);
}

TEST(ServerTest, FullQueueGivesResourceExhaustedNamingTheLimit) {
  Harness h(kCheckpoint, /*max_queue=*/2, /*max_num_seqs=*/1);
  h.gate.CloseAndWait();  // nothing is admitted while closed, so both requests wait
  grpc::ClientContext a_ctx, b_ctx;
  auto a = h.stub->GenerateStream(&a_ctx, TokenRequest({1, 2, 3}, 8));
  auto b = h.stub->GenerateStream(&b_ctx, TokenRequest({1, 2, 4}, 8));
  while (h.server->loop().num_in_flight() < 2) std::this_thread::yield();
  v1::GenerateResponse resp;
  const grpc::Status full = Unary(*h.stub, TokenRequest({1, 2, 5}, 8), &resp);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("max_queue 2"));
  h.gate.Open();
  v1::GenerateStreamResponse msg;
  while (a->Read(&msg)) {
  }
  while (b->Read(&msg)) {
  }
  EXPECT_TRUE(a->Finish().ok());
  EXPECT_TRUE(b->Finish().ok());
}

TEST(ServerTest, EveryInvalidFieldGivesInvalidArgumentNamingIt) {
  Harness h;
  const v1::GenerateRequest good = TokenRequest({1, 2, 3}, 4);
  struct Case {
    std::string field;
    std::function<void(v1::GenerateRequest*)> mutate;
  };
  const std::vector<Case> cases = {
      {"request_id", [](auto* r) { r->set_request_id(std::string(200, 'x')); }},
      {"prompt:", [](auto* r) { r->clear_input(); }},
      {"prompt:", [](auto* r) { r->set_prompt("hello"); }},  // this checkpoint has no tokenizer
      {"prompt_token_ids:", [](auto* r) { r->mutable_prompt_token_ids()->clear_ids(); }},
      {"prompt_token_ids[1]", [](auto* r) { r->mutable_prompt_token_ids()->set_ids(1, 160); }},
      {"prompt_token_ids[0]", [](auto* r) { r->mutable_prompt_token_ids()->set_ids(0, -1); }},
      {"sampling.temperature", [](auto* r) { r->mutable_sampling()->set_temperature(-1.0f); }},
      {"sampling.top_k", [](auto* r) { r->mutable_sampling()->set_top_k(-2); }},
      {"sampling.top_p", [](auto* r) { r->mutable_sampling()->set_top_p(0.0f); }},
      {"sampling.top_p", [](auto* r) { r->mutable_sampling()->set_top_p(1.5f); }},
      {"sampling.min_p", [](auto* r) { r->mutable_sampling()->set_min_p(1.5f); }},
      {"sampling.repetition_penalty",
       [](auto* r) { r->mutable_sampling()->set_repetition_penalty(0.0f); }},
      {"sampling.presence_penalty",
       [](auto* r) { r->mutable_sampling()->set_presence_penalty(2.5f); }},
      {"sampling.frequency_penalty",
       [](auto* r) { r->mutable_sampling()->set_frequency_penalty(-2.5f); }},
      {"stopping.max_new_tokens", [](auto* r) { r->mutable_stopping()->set_max_new_tokens(0); }},
      {"stopping.stop[1]",
       [](auto* r) {
         r->mutable_stopping()->add_stop("ok");
         r->mutable_stopping()->add_stop("");
       }},
      {"stopping.stop_token_ids[0]",
       [](auto* r) { r->mutable_stopping()->add_stop_token_ids(500); }},
      {"top_logprobs", [](auto* r) { r->set_top_logprobs(21); }},
      {"routing.threshold", [](auto* r) { r->mutable_routing()->set_threshold(1.0); }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req = good;
    c.mutate(&req);
    v1::GenerateResponse resp;
    const grpc::Status unary = Unary(*h.stub, req, &resp);
    EXPECT_EQ(unary.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(unary.error_message(), HasSubstr(c.field));
    Streamed s = Stream(*h.stub, req);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(s.status.error_message(), HasSubstr(c.field));
  }
  v1::GenerateResponse resp;
  const grpc::Status too_long = Unary(*h.stub, TokenRequest({1, 2, 3}, kMaxSeqLen), &resp);
  EXPECT_EQ(too_long.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(too_long.error_message(), HasSubstr("max_seq_len 512"));
  // The good request itself passes.
  EXPECT_TRUE(Unary(*h.stub, good, &resp).ok());
}

TEST(ServerTest, DrainRefusesNewRequestsAndEndsStragglersAfterTheTimeout) {
  Harness h(kCheckpoint, 64, 16, int64_t{16} << 20, /*drain_timeout=*/absl::ZeroDuration());
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  auto reader = h.stub->GenerateStream(&ctx, TokenRequest({1, 2, 3, 4}, 480));
  v1::GenerateStreamResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  h.gate.CloseAndWait();
  std::thread drainer([&] { h.server->Drain(); });
  while (!h.server->loop().draining()) std::this_thread::yield();
  v1::GenerateResponse resp;
  const grpc::Status refused = Unary(*h.stub, TokenRequest({1, 2}, 2), &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("draining"));
  auto health = grpc::health::v1::Health::NewStub(h.channel);
  grpc::health::v1::HealthCheckResponse hresp;
  do {  // Drain sets NOT_SERVING right after it starts the drain
    grpc::ClientContext hctx;
    ASSERT_TRUE(health->Check(&hctx, {}, &hresp).ok());
  } while (hresp.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  h.gate.Open();  // the zero drain timeout has passed: the stream is ended
  while (reader->Read(&msg)) {
  }
  const grpc::Status ended = reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(ended.error_message(), HasSubstr("drain timeout"));
  drainer.join();
  EXPECT_EQ(h.server->loop().kv_used_pages(), 0);
}

// A checkpoint that loads (its routers and norms are finite; float matrices are not scanned) but
// whose LM head is NaN: every logit is NaN, so the first step that samples fails inside the
// engine.
std::string NanLmHeadCheckpoint(const std::filesystem::path& dir) {
  std::filesystem::create_symlink(std::filesystem::path(kCheckpoint) / "config.json",
                                  dir / "config.json");
  std::ifstream in(std::filesystem::path(kCheckpoint) / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), sizeof(header_len));
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  const nlohmann::json& head = header.at("lm_head.weight");
  MODSERVE_CHECK(head.at("dtype") == "F32");
  const size_t begin = 8 + header_len + head.at("data_offsets")[0].get<size_t>();
  const size_t end = 8 + header_len + head.at("data_offsets")[1].get<size_t>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t at = begin; at < end; at += sizeof(float)) std::memcpy(&bytes[at], &nan, 4);
  engine::testing::WriteBytes((dir / "model.safetensors").string(), bytes);
  return dir.string();
}

grpc::health::v1::HealthCheckResponse::ServingStatus HealthStatus(grpc::Channel* channel) {
  auto health = grpc::health::v1::Health::NewStub(
      std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = health->Check(&ctx, {}, &resp);
  MODSERVE_CHECK(s.ok()) << s.error_message();
  return resp.status();
}

TEST(ServerTest, EngineFailureEndsRequestsWithInternalAndTurnsHealthNotServing) {
  // The first forward pass fails as a device error would (injected backend fault).
  engine::FaultInjection faults;
  faults.backend_fault_step = 1;
  Harness h(kCheckpoint, 64, 16, int64_t{16} << 20, absl::Seconds(30), 1, faults);
  ASSERT_EQ(HealthStatus(h.channel.get()), grpc::health::v1::HealthCheckResponse::SERVING);

  // Both requests wait at the gate, so they are in flight together when the step fails.
  h.gate.CloseAndWait();
  v1::GenerateRequest unary_req = TokenRequest({1, 2, 3}, 8);
  unary_req.set_request_id("failing-unary");
  v1::GenerateRequest stream_req = TokenRequest({4, 5, 6}, 8);
  stream_req.set_request_id("failing-stream");
  grpc::ClientContext unary_ctx;
  SetDeadline(&unary_ctx, absl::Seconds(60));
  v1::GenerateResponse unary_resp;
  absl::Notification unary_done;
  grpc::Status unary_status;
  h.stub->async()->Generate(&unary_ctx, &unary_req, &unary_resp, [&](grpc::Status s) {
    unary_status = std::move(s);
    unary_done.Notify();
  });
  grpc::ClientContext stream_ctx;
  SetDeadline(&stream_ctx, absl::Seconds(60));
  auto reader = h.stub->GenerateStream(&stream_ctx, stream_req);
  while (h.server->loop().num_in_flight() < 2) absl::SleepFor(absl::Milliseconds(1));

  ::testing::internal::CaptureStderr();
  h.gate.Open();
  v1::GenerateStreamResponse msg;
  EXPECT_FALSE(reader->Read(&msg)) << "the step that fails samples nothing";
  const grpc::Status stream_status = reader->Finish();
  unary_done.WaitForNotification();
  ASSERT_TRUE(h.server->loop().WaitIdle(absl::Seconds(30)));
  const std::string log = ::testing::internal::GetCapturedStderr();

  for (const grpc::Status* s : std::vector<const grpc::Status*>{&unary_status, &stream_status}) {
    EXPECT_EQ(s->error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_THAT(s->error_message(), HasSubstr("server log"));  // details stay server-side
  }
  // The log names the failure and every request it ended.
  EXPECT_THAT(log, HasSubstr("engine step failed"));
  EXPECT_THAT(log, HasSubstr("injected backend fault"));
  EXPECT_THAT(log, HasSubstr("failing-unary"));
  EXPECT_THAT(log, HasSubstr("failing-stream"));
  EXPECT_EQ(h.server->loop().kv_used_pages(), 0);
  EXPECT_FALSE(h.server->loop().healthy());

  // Health follows within the monitor's period; later requests are refused, not queued.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (HealthStatus(h.channel.get()) != grpc::health::v1::HealthCheckResponse::NOT_SERVING &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(HealthStatus(h.channel.get()), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  v1::GenerateResponse resp;
  const grpc::Status after = Unary(*h.stub, TokenRequest({1, 2}, 4), &resp);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(after.error_message(), HasSubstr("restart"));
}

TEST(ServerTest, NanLogitsFailEachRequestAloneAndTheServerStaysHealthy) {
  // A corrupted checkpoint (a NaN LM head: float matrices are not scanned at load, unlike the
  // norms) makes every sampling fail: that is each request's own INTERNAL error, not a backend
  // fault, so the engine keeps serving (and health says so).
  engine::testing::ScratchDir scratch;
  Harness h(NanLmHeadCheckpoint(scratch.path()));
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    v1::GenerateResponse resp;
    v1::GenerateRequest req = TokenRequest({1, 2, 3 + i}, 8);
    req.set_request_id(absl::StrCat("nan-", i));
    const grpc::Status s = Unary(*h.stub, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_THAT(s.error_message(), HasSubstr("server log"));
  }
  ASSERT_TRUE(h.server->loop().WaitIdle(absl::Seconds(30)));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("'nan-2' failed on its own"));
  EXPECT_THAT(log, HasSubstr("logit of token"));
  EXPECT_TRUE(h.server->loop().healthy());
  EXPECT_EQ(HealthStatus(h.channel.get()), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(h.server->loop().kv_used_pages(), 0);
}

TEST(ServerTest, HealthServesOnceLoadedAndModelInfoDescribesTheCheckpoint) {
  Harness h;
  auto health = grpc::health::v1::Health::NewStub(h.channel);
  for (const char* service : {"", "modserve.v1.ModServe"}) {
    grpc::ClientContext hctx;
    grpc::health::v1::HealthCheckRequest hreq;
    hreq.set_service(service);
    grpc::health::v1::HealthCheckResponse hresp;
    ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok()) << service;
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  v1::GetModelInfoResponse info;
  grpc::ClientContext ctx;
  ASSERT_TRUE(h.stub->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.vocab_size(), 160);
  EXPECT_EQ(info.max_seq_len(), kMaxSeqLen);
  EXPECT_THAT(Ids(info.routed_layers()), ::testing::ElementsAre(0, 2));
  EXPECT_FALSE(info.has_tokenizer());
  EXPECT_EQ(info.kv_cache_dtype(), "F32");
  EXPECT_EQ(info.matmul_precision(), "highest");
}

}  // namespace
}  // namespace modserve::server
