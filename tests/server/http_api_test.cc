// The HTTP API of an in-process Server over the demo checkpoint, on the same step loop as gRPC:
// HTTP and gRPC give the same tokens, sixteen concurrent streams over both APIs at once each
// equal their lone result, a client that disconnects mid-stream has its pages freed by the very
// next engine iteration (as a gRPC cancel), a full queue is a 429 and draining a 503. The engine
// is held still between steps through the EngineGate test hook.
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/server.h"
#include "tests/server/engine_gate.h"
#include "tests/server/raw_http_client.h"

namespace modserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::HttpPost;
using testing::RawClient;
using testing::ResponseBody;
using testing::SseData;
using json = nlohmann::json;

struct Harness {
  explicit Harness(int32_t max_queue = 64, int32_t max_num_seqs = 16) {
    ServerOptions so;
    so.http_port = 0;
    so.loop.scheduler.max_num_seqs = max_num_seqs;
    so.loop.scheduler.max_batch_tokens = 64;
    so.loop.scheduler.max_queue = max_queue;
    so.loop.before_iteration = [this] { gate.Pass(); };
    engine::EngineOptions eo;
    eo.model_dir = MODSERVE_SOURCE_DIR "/models/demo";
    eo.num_threads = 1;
    eo.max_seqs = 16;
    eo.max_batch_tokens = 64;
    eo.kv_cache_bytes = int64_t{32} << 20;
    auto s = Server::Start(so, eo);
    MODSERVE_CHECK(s.ok()) << s.status();
    server = *std::move(s);
    stub = v1::ModServe::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", server->port()), grpc::InsecureChannelCredentials()));
  }
  ~Harness() {
    gate.Open();
    server->Shutdown();
  }

  // One request on a fresh connection; the whole response.
  std::string Request(const std::string& path, const json& body) {
    RawClient c(server->http_port());
    c.Send(HttpPost(path, body.dump()));
    return c.ReadResponses(1);
  }

  // Every HTTP request answered has let go of its state (its job, exchange and handles).
  bool HttpReleased() {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (server->http_requests_in_flight() > 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return server->http_requests_in_flight() == 0;
  }

  testing::EngineGate gate;
  std::unique_ptr<Server> server;
  std::unique_ptr<v1::ModServe::Stub> stub;
};

json Completion(const std::vector<int32_t>& prompt, int max_tokens, bool stream = false) {
  return {{"prompt", prompt},   {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true}, {"stream", stream},         {"logprobs", 0}};
}

v1::GenerateResponse Grpc(v1::ModServe::Stub& stub, const std::vector<int32_t>& prompt,
                          int max_new_tokens) {
  v1::GenerateRequest r;
  r.mutable_prompt_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  r.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::GenerateResponse resp;
  const grpc::Status s = stub.Generate(&ctx, r, &resp);
  MODSERVE_CHECK(s.ok()) << s.error_message();
  return resp;
}

// A streamed completion's text and logprobs, joined.
struct Joined {
  std::string text;
  std::vector<float> logprobs;
  std::string finish_reason;
  bool done = false;
};

Joined JoinStream(const std::string& response) {
  Joined out;
  for (const std::string& data : SseData(ResponseBody(response))) {
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    const json chunk = json::parse(data);
    for (const json& c : chunk["choices"]) {
      out.text += c["text"].get<std::string>();
      if (!c["logprobs"].is_null()) {
        for (const json& lp : c["logprobs"]["token_logprobs"]) out.logprobs.push_back(lp);
      }
      if (!c["finish_reason"].is_null()) out.finish_reason = c["finish_reason"];
    }
  }
  return out;
}

TEST(HttpApiTest, UnaryAndStreamEqualGrpc) {
  Harness h;
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 5};
  const v1::GenerateResponse want = Grpc(*h.stub, prompt, 12);
  const std::string unary = h.Request("/v1/completions", Completion(prompt, 12));
  ASSERT_THAT(unary, StartsWith("HTTP/1.1 200"));
  const json got = json::parse(ResponseBody(unary));
  EXPECT_EQ(got["choices"][0]["text"], want.text());
  EXPECT_EQ(got["usage"]["completion_tokens"], 12);
  const json& lps = got["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(lps.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(lps[i].get<float>(), want.logprobs(i).logprob());
  const Joined streamed = JoinStream(h.Request("/v1/completions", Completion(prompt, 12, true)));
  EXPECT_TRUE(streamed.done);
  EXPECT_EQ(streamed.text, want.text());
  EXPECT_EQ(streamed.finish_reason, "length");
  ASSERT_EQ(streamed.logprobs.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(streamed.logprobs[i], want.logprobs(i).logprob());
  EXPECT_TRUE(h.HttpReleased());
}

TEST(HttpApiTest, ConcurrentStreamsOverBothApisEqualTheirLoneResults) {
  Harness h;
  constexpr int kEach = 8;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> lone;
  for (int i = 0; i < kEach; ++i) {
    prompts.push_back({1, 10 + i, 20 + 2 * i, 7});
    lone.push_back(Grpc(*h.stub, prompts.back(), 10).text());
  }
  std::vector<std::string> http(kEach), grpc_text(kEach);
  std::vector<std::thread> threads;
  for (int i = 0; i < kEach; ++i) {
    threads.emplace_back([&, i] {
      http[i] = JoinStream(h.Request("/v1/completions", Completion(prompts[i], 10, true))).text;
    });
    threads.emplace_back([&, i] { grpc_text[i] = Grpc(*h.stub, prompts[i], 10).text(); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kEach; ++i) {
    EXPECT_EQ(http[i], lone[i]) << i;
    EXPECT_EQ(grpc_text[i], lone[i]) << i;
  }
  EXPECT_TRUE(h.HttpReleased());
}

TEST(HttpApiTest, DisconnectFreesThePagesInTheNextIteration) {
  Harness h;
  RawClient c(h.server->http_port());
  c.Send(HttpPost("/v1/completions", Completion({1, 2, 3, 4, 5, 6, 7, 8}, 1500, true).dump()));
  c.ReadUntil([](const std::string& r) { return SseData(ResponseBody(r)).size() >= 2; });
  h.gate.CloseAndWait();  // mid-way: the engine holds the sequence's pages
  EXPECT_GT(h.server->loop().kv_used_pages(), 0);
  EXPECT_EQ(h.server->loop().num_in_flight(), 1);
  c.Close();
  // The HTTP thread sees the EOF at once and cancels; the engine is still held.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (h.server->http_num_connections() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(h.server->http_num_connections(), 0);
  h.gate.StepOnce();  // one iteration: the cancelled sequence is released in it
  EXPECT_EQ(h.server->loop().kv_used_pages(), 0);
  EXPECT_EQ(h.server->loop().num_in_flight(), 0);
  h.gate.Open();
  EXPECT_TRUE(h.HttpReleased());
}

TEST(HttpApiTest, FullQueueIs429AndDrainingIs503) {
  Harness h(/*max_queue=*/1, /*max_num_seqs=*/1);
  h.gate.CloseAndWait();  // nothing is admitted while closed
  RawClient waiting(h.server->http_port());
  waiting.Send(HttpPost("/v1/completions", Completion({1, 2, 3}, 4).dump()));
  while (h.server->loop().num_in_flight() < 1) std::this_thread::yield();
  const std::string full = h.Request("/v1/completions", Completion({1, 2, 4}, 4));
  EXPECT_THAT(full, StartsWith("HTTP/1.1 429"));
  const json err = json::parse(ResponseBody(full));
  EXPECT_EQ(err["error"]["type"], "rate_limit_error");
  EXPECT_THAT(err["error"]["message"].get<std::string>(), HasSubstr("max_queue 1"));
  h.gate.Open();
  EXPECT_THAT(waiting.ReadResponses(1), StartsWith("HTTP/1.1 200"));
  h.server->loop().StartDrain(absl::Seconds(30));
  EXPECT_THAT(h.Request("/v1/completions", Completion({1, 2, 5}, 4)), StartsWith("HTTP/1.1 503"));
  RawClient health(h.server->http_port());
  health.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = health.ReadResponses(1);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(r, HasSubstr("draining"));
}

}  // namespace
}  // namespace modserve::server
