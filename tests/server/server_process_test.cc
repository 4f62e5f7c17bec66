// End-to-end: the built `modserve` binary as a process on a free loopback port. SIGTERM while a
// stream is in flight must let the stream finish and then exit 0.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace modserve::server {
namespace {

const char kCheckpoint[] =
    MODSERVE_SOURCE_DIR "/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias";
const char kBinary[] = MODSERVE_BINARY_DIR "/bin/modserve";
const char kGenerate[] = MODSERVE_BINARY_DIR "/bin/modserve-generate";

// A child process with its stdout on a pipe.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
};

Child Spawn(const std::vector<std::string>& args) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c;
  EXPECT_EQ(posix_spawn(&c.pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  c.out = fdopen(fds[0], "r");
  return c;
}

// Reads stdout lines until "modserve listening on HOST:PORT"; returns PORT or 0.
int ReadPort(FILE* out) {
  char line[512];
  while (fgets(line, sizeof(line), out) != nullptr) {
    const std::string s(line);
    const std::string prefix = "modserve listening on 127.0.0.1:";
    if (absl::StartsWith(s, prefix)) {
      int port = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(s.substr(prefix.size())), &port)) {
        return port;
      }
    }
  }
  return 0;
}

int WaitExit(pid_t pid) {
  int wstatus = 0;
  if (waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus)) return -1;
  return WEXITSTATUS(wstatus);
}

// modserve-generate's JSON for prompt 1,42,7,99 and max_new_tokens (discarded on failure).
nlohmann::json GenerateJson(int max_new_tokens) {
  Child gen =
      Spawn({kGenerate, "--model", kCheckpoint, "--prompt_ids", "1,42,7,99", "--max_new_tokens",
             std::to_string(max_new_tokens), "--threads", "1", "--json"});
  EXPECT_GT(gen.pid, 0);
  std::string json;
  char buf[4096];
  while (fgets(buf, sizeof(buf), gen.out) != nullptr) json += buf;
  fclose(gen.out);
  EXPECT_EQ(WaitExit(gen.pid), 0);
  return nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
}

// The same request as GenerateJson's, with modserve-generate's defaults (greedy, EOS honoured).
v1::GenerateRequest SameRequest(int max_new_tokens) {
  v1::GenerateRequest req;
  for (int32_t id : {1, 42, 7, 99}) req.mutable_prompt_token_ids()->add_ids(id);
  req.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  return req;
}

// A unary Generate's tokens and logprobs are modserve-generate's.
void ExpectUnaryMatches(v1::ModServe::Stub& stub, const v1::GenerateRequest& req,
                        const nlohmann::json& want, const std::string& what) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GenerateResponse resp;
  ASSERT_TRUE(stub.Generate(&ctx, req, &resp).ok()) << what;
  EXPECT_EQ(std::vector<int32_t>(resp.token_ids().begin(), resp.token_ids().end()),
            want["token_ids"].get<std::vector<int32_t>>())
      << what;
  EXPECT_EQ(resp.usage().prompt_tokens(), 4) << what;
  ASSERT_EQ(resp.logprobs_size(), static_cast<int>(want["logprobs"].size())) << what;
  for (int i = 0; i < resp.logprobs_size(); ++i) {
    EXPECT_FLOAT_EQ(resp.logprobs(i).logprob(), want["logprobs"][i].get<float>()) << what << i;
  }
}

// `modserve` on the test checkpoint, a free port and one thread, plus `flags`; stub is null when
// the process did not start or never printed its port.
struct Server {
  Child child;
  std::unique_ptr<v1::ModServe::Stub> stub;
};

Server StartServer(const std::vector<std::string>& flags = {}) {
  std::vector<std::string> args = {kBinary, "--model",   kCheckpoint, "--port",
                                   "0",     "--threads", "1"};
  args.insert(args.end(), flags.begin(), flags.end());
  Server s{.child = Spawn(args)};
  if (s.child.pid <= 0) return s;
  if (const int port = ReadPort(s.child.out); port > 0) {
    s.stub = v1::ModServe::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  return s;
}

// SIGTERM, then the exit status (-1 if it did not exit normally).
int StopServer(Server& s) {
  EXPECT_EQ(kill(s.child.pid, SIGTERM), 0);
  const int status = WaitExit(s.child.pid);
  fclose(s.child.out);
  return status;
}

TEST(ServerProcessTest, UnaryAndStreamReturnWhatModserveGenerateReturns) {
  const nlohmann::json want = GenerateJson(24);
  ASSERT_FALSE(want.is_discarded());
  const std::vector<int32_t> want_ids = want["token_ids"].get<std::vector<int32_t>>();

  Server server = StartServer();
  ASSERT_NE(server.stub, nullptr);
  const v1::GenerateRequest req = SameRequest(24);
  ExpectUnaryMatches(*server.stub, req, want, "unary");
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = server.stub->GenerateStream(&ctx, req);
    std::vector<int32_t> ids;
    v1::GenerateStreamResponse msg;
    while (reader->Read(&msg))
      ids.insert(ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(ids, want_ids);
  }
  EXPECT_EQ(StopServer(server), 0);
}

// --kv_block_size sets the KV page size: the server serves the same tokens and logprobs as
// modserve-generate (16-token pages) with pages of 64 and of 5 tokens; 0 exits 2, a flag error.
TEST(ServerProcessTest, KvBlockSizeFlagServesTheSameTokens) {
  const nlohmann::json want = GenerateJson(40);
  ASSERT_FALSE(want.is_discarded());
  for (const char* block_size : {"64", "5"}) {
    Server server = StartServer({"--kv_block_size", block_size});
    ASSERT_NE(server.stub, nullptr) << block_size;
    ExpectUnaryMatches(*server.stub, SameRequest(40), want,
                       std::string("--kv_block_size ") + block_size + ": ");
    EXPECT_EQ(StopServer(server), 0);
  }
  Child bad = Spawn({kBinary, "--model", kCheckpoint, "--port", "0", "--kv_block_size", "0"});
  ASSERT_GT(bad.pid, 0);
  EXPECT_EQ(WaitExit(bad.pid), 2);
  fclose(bad.out);
}

TEST(ServerProcessTest, SigtermDrainsInFlightStreamAndExitsZero) {
  Server server = StartServer({"--drain_timeout", "30s"});
  ASSERT_NE(server.stub, nullptr);
  v1::GenerateRequest req;
  req.mutable_prompt_token_ids()->add_ids(1);
  req.mutable_prompt_token_ids()->add_ids(42);
  req.mutable_stopping()->set_max_new_tokens(300);
  req.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = server.stub->GenerateStream(&ctx, req);
  v1::GenerateStreamResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  int num_tokens = msg.token_ids_size();
  v1::FinishReason finish_reason = msg.finish_reason();
  ASSERT_EQ(kill(server.child.pid, SIGTERM), 0);
  while (reader->Read(&msg)) {
    num_tokens += msg.token_ids_size();
    finish_reason = msg.finish_reason();
  }
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(num_tokens, 300);
  EXPECT_EQ(finish_reason, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(WaitExit(server.child.pid), 0);
  fclose(server.child.out);
}

}  // namespace
}  // namespace modserve::server
