// Security and limits of the gRPC edge on real loopback channels to an in-process server: TLS and
// mutual TLS with a PKI made at test time, bearer tokens on every ModServe method, the health-only
// port, request limits, the message size limit, the concurrent-call limit, and start-up refusals
// of bad credential files. Token parsing and comparison are unit-tested first.
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "server/security.h"
#include "server/server.h"
#include "tests/engine/model/checkpoint_test_util.h"
#include "tests/server/engine_gate.h"
#include "tests/server/test_certs.h"

namespace modserve::server {
namespace {

using ::modserve::engine::testing::ScratchDir;
using ::modserve::engine::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const char kCheckpoint[] =
    MODSERVE_SOURCE_DIR "/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias";
const char kToken[] = "s3cret-Token_0123456789";
const char kRotatedToken[] = "next-token-abcdef";

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(ConstantTimeEqualsTest, ComparesEveryByte) {
  const std::vector<uint8_t> a = {1, 2, 3, 4};
  EXPECT_TRUE(ConstantTimeEquals(a, std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_FALSE(ConstantTimeEquals(a, std::vector<uint8_t>{0, 2, 3, 4}));
  EXPECT_FALSE(ConstantTimeEquals(a, std::vector<uint8_t>{1, 2, 3, 5}));
  EXPECT_FALSE(ConstantTimeEquals(a, std::vector<uint8_t>{1, 2, 3}));
  EXPECT_TRUE(ConstantTimeEquals({}, {}));
}

TEST(TokenAuthenticatorTest, AcceptsEveryListedTokenAndNothingElse) {
  auto auth = TokenAuthenticator::FromTokens({kToken, kRotatedToken});
  ASSERT_TRUE(auth.ok()) << auth.status();
  auto check = [&](std::vector<std::string> values) {
    Metadata md;
    for (const std::string& v : values) md.emplace("authorization", v);
    return (*auth)->Check(md);
  };
  EXPECT_TRUE(check({absl::StrCat("Bearer ", kToken)}).ok());
  EXPECT_TRUE(check({absl::StrCat("bearer  ", kRotatedToken)}).ok());  // scheme case, spaces
  EXPECT_TRUE(check({"Basic abc", absl::StrCat("Bearer ", kToken)}).ok());
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{absl::StrCat("Bearer ", kToken, "x")},
                                             {absl::StrCat("Bearer ", std::string(kToken, 5))},
                                             {"Bearer "},
                                             {kToken},
                                             {absl::StrCat("Basic ", kToken)},
                                             {}}) {
    const grpc::Status s = check(bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), AllOf(Not(HasSubstr(kToken)), Not(HasSubstr(kRotatedToken))));
  }
  EXPECT_THAT(check({}).error_message(), HasSubstr("missing 'authorization: Bearer <token>'"));
  EXPECT_THAT(check({"Bearer nope"}).error_message(), HasSubstr("not valid"));
}

TEST(TokenAuthenticatorTest, FileRulesNameTheFileAndNeverTheToken) {
  ScratchDir dir;
  const std::string path = absl::StrCat(dir.path(), "/token");
  std::ofstream(path) << "\n  " << kToken << "  \n" << kRotatedToken << "\n";
  auto auth = TokenAuthenticator::FromFile(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  Metadata md;
  const std::string value = absl::StrCat("Bearer ", kRotatedToken);
  md.emplace("authorization", value);
  EXPECT_TRUE((*auth)->Check(md).ok());

  std::ofstream(path, std::ios::trunc) << "  \n\n";
  EXPECT_THAT(TokenAuthenticator::FromFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("--auth_token_file: '", path, "' holds no token")));
  std::ofstream(path, std::ios::trunc) << "two words\n";
  auto spaced = TokenAuthenticator::FromFile(path);
  EXPECT_THAT(spaced, StatusIs(absl::StatusCode::kInvalidArgument, "token 1 has a byte outside"));
  EXPECT_THAT(std::string(spaced.status().message()), Not(HasSubstr("words")));
  std::ofstream(path, std::ios::trunc) << "";
  EXPECT_THAT(TokenAuthenticator::FromFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument, "' is empty"));
  EXPECT_THAT(TokenAuthenticator::FromFile(path + ".missing"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("--auth_token_file: '", path,
                                    ".missing' cannot be opened: No such file")));
}

using testing::EngineGate;

class ServerSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto certs = testing::MakeTestCerts(dir_.path());
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *std::move(certs);
    token_file_ = absl::StrCat(dir_.path(), "/token");
    std::ofstream(token_file_) << kToken << "\n" << kRotatedToken << "\n";
  }
  void TearDown() override {
    gate_.Open();
    if (server_) server_->Shutdown();
  }

  ServerOptions Options() {
    ServerOptions so;
    so.loop.scheduler.max_num_seqs = 4;
    so.loop.scheduler.max_batch_tokens = 64;
    so.loop.before_iteration = [this] { gate_.Pass(); };
    return so;
  }
  static engine::EngineOptions EngineOpts() {
    engine::EngineOptions eo;
    eo.model_dir = kCheckpoint;
    eo.num_threads = 1;
    eo.max_seqs = 4;
    eo.max_batch_tokens = 64;
    eo.kv_cache_bytes = int64_t{4} << 20;
    return eo;
  }
  void Start(const ServerOptions& so) {
    auto s = Server::Start(so, EngineOpts());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  std::string Target() const { return absl::StrCat("127.0.0.1:", server_->port()); }

  std::shared_ptr<grpc::Channel> TlsChannel(const std::string& root, const std::string& key = "",
                                            const std::string& cert = "") const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = root;
    o.pem_private_key = key;
    o.pem_cert_chain = cert;
    return grpc::CreateChannel(Target(), grpc::SslCredentials(o));
  }
  std::shared_ptr<grpc::Channel> PlainChannel() const {
    return grpc::CreateChannel(Target(), grpc::InsecureChannelCredentials());
  }

  ScratchDir dir_;
  testing::TestCerts certs_;
  std::string token_file_;
  EngineGate gate_;
  std::unique_ptr<Server> server_;
};

v1::GenerateRequest TokenRequest(int num_prompt_tokens, int32_t max_new_tokens) {
  v1::GenerateRequest r;
  for (int i = 0; i < num_prompt_tokens; ++i) r.mutable_prompt_token_ids()->add_ids(1 + i % 150);
  r.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

void Prepare(grpc::ClientContext* ctx, const std::string& authorization = "") {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!authorization.empty()) ctx->AddMetadata("authorization", authorization);
}

grpc::Status CallInfo(const std::shared_ptr<grpc::Channel>& channel,
                      const std::string& authorization = "") {
  grpc::ClientContext ctx;
  Prepare(&ctx, authorization);
  v1::GetModelInfoResponse resp;
  return v1::ModServe::NewStub(channel)->GetModelInfo(&ctx, {}, &resp);
}

grpc::Status CallGenerate(v1::ModServe::Stub& stub, const v1::GenerateRequest& req,
                          const std::string& authorization = "") {
  grpc::ClientContext ctx;
  Prepare(&ctx, authorization);
  v1::GenerateResponse resp;
  return stub.Generate(&ctx, req, &resp);
}

grpc::Status CallStream(v1::ModServe::Stub& stub, const v1::GenerateRequest& req,
                        const std::string& authorization = "", int* num_tokens = nullptr) {
  grpc::ClientContext ctx;
  Prepare(&ctx, authorization);
  auto reader = stub.GenerateStream(&ctx, req);
  v1::GenerateStreamResponse msg;
  int n = 0;
  while (reader->Read(&msg)) n += msg.token_ids_size();
  if (num_tokens != nullptr) *num_tokens = n;
  return reader->Finish();
}

TEST_F(ServerSecurityTest, TlsCallsWorkWithTheCaAndFailWithoutIt) {
  ServerOptions so = Options();
  so.tls = {certs_.server_cert.path, certs_.server_key.path, ""};
  Start(so);
  auto tls = TlsChannel(certs_.ca_cert.pem);
  EXPECT_TRUE(CallInfo(tls).ok());
  auto stub = v1::ModServe::NewStub(tls);
  int num_tokens = 0;
  EXPECT_TRUE(CallStream(*stub, TokenRequest(4, 6), "", &num_tokens).ok());
  EXPECT_EQ(num_tokens, 6);
  // A plaintext client, and a TLS client that does not trust the server's CA, get no call.
  EXPECT_EQ(CallInfo(PlainChannel()).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CallInfo(TlsChannel(certs_.client_cert.pem)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServerSecurityTest, MutualTlsNeedsAClientCertificateFromTheConfiguredCa) {
  ServerOptions so = Options();
  so.tls = {certs_.server_cert.path, certs_.server_key.path, certs_.ca_cert.path};
  Start(so);
  EXPECT_TRUE(
      CallInfo(TlsChannel(certs_.ca_cert.pem, certs_.client_key.pem, certs_.client_cert.pem)).ok());
  EXPECT_EQ(CallInfo(TlsChannel(certs_.ca_cert.pem)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CallInfo(TlsChannel(certs_.ca_cert.pem, certs_.other_client_key.pem,
                                certs_.other_client_cert.pem))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServerSecurityTest, EveryModServeMethodNeedsAValidBearerToken) {
  ServerOptions so = Options();
  so.tls = {certs_.server_cert.path, certs_.server_key.path, ""};
  so.auth_token_file = token_file_;
  Start(so);
  auto stub = v1::ModServe::NewStub(TlsChannel(certs_.ca_cert.pem));
  using Call = std::function<grpc::Status(const std::string&)>;
  const std::vector<std::pair<std::string, Call>> methods = {
      {"Generate", [&](const std::string& a) { return CallGenerate(*stub, TokenRequest(3, 2), a); }},
      {"GenerateStream",
       [&](const std::string& a) { return CallStream(*stub, TokenRequest(3, 2), a); }},
      {"Tokenize",
       [&](const std::string& a) {
         grpc::ClientContext ctx;
         Prepare(&ctx, a);
         v1::TokenizeRequest req;
         req.set_text("hi");
         v1::TokenizeResponse resp;
         return stub->Tokenize(&ctx, req, &resp);
       }},
      {"Detokenize",
       [&](const std::string& a) {
         grpc::ClientContext ctx;
         Prepare(&ctx, a);
         v1::DetokenizeRequest req;
         req.add_token_ids(5);
         v1::DetokenizeResponse resp;
         return stub->Detokenize(&ctx, req, &resp);
       }},
      {"GetModelInfo",
       [&](const std::string& a) {
         grpc::ClientContext ctx;
         Prepare(&ctx, a);
         v1::GetModelInfoResponse resp;
         return stub->GetModelInfo(&ctx, {}, &resp);
       }},
  };
  // This checkpoint has no tokenizer: past the token check, (De)Tokenize end in
  // FAILED_PRECONDITION, which shows the call got through.
  const std::map<std::string, grpc::StatusCode> authorized_code = {
      {"Generate", grpc::StatusCode::OK},
      {"GenerateStream", grpc::StatusCode::OK},
      {"Tokenize", grpc::StatusCode::FAILED_PRECONDITION},
      {"Detokenize", grpc::StatusCode::FAILED_PRECONDITION},
      {"GetModelInfo", grpc::StatusCode::OK}};
  for (const auto& [name, call] : methods) {
    const grpc::Status missing = call("");
    EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_THAT(missing.error_message(), HasSubstr("missing")) << name;
    const grpc::Status wrong = call("Bearer s3cret-Token_0123456788");
    EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_THAT(wrong.error_message(),
                AllOf(HasSubstr("not valid"), Not(HasSubstr("s3cret")), Not(HasSubstr("next"))))
        << name;
    EXPECT_EQ(call(absl::StrCat("Bearer ", kToken)).error_code(), authorized_code.at(name))
        << name;
    EXPECT_EQ(call(absl::StrCat("Bearer ", kRotatedToken)).error_code(), authorized_code.at(name))
        << name;
  }
}

TEST_F(ServerSecurityTest, HealthPortServesWithoutTokenOrTlsAndOnlyHealth) {
  ServerOptions so = Options();
  so.tls = {certs_.server_cert.path, certs_.server_key.path, ""};
  so.auth_token_file = token_file_;
  so.health_port = 0;
  Start(so);
  ASSERT_GT(server_->health_port(), 0);
  ASSERT_NE(server_->health_port(), server_->port());
  auto plain = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->health_port()),
                                   grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(plain);
  for (const char* service : {"", "modserve.v1.ModServe"}) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok()) << service;
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  // The health port does not serve the model, even with a token.
  EXPECT_EQ(CallInfo(plain, absl::StrCat("Bearer ", kToken)).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // The main port serves health too: over TLS, without a token.
  grpc::ClientContext ctx;
  Prepare(&ctx);
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(grpc::health::v1::Health::NewStub(TlsChannel(certs_.ca_cert.pem))
                  ->Check(&ctx, {}, &resp)
                  .ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ServerSecurityTest, RequestAndMessageLimitsNameTheLimit) {
  ServerOptions so = Options();
  so.request_limits.max_prompt_tokens = 8;
  so.request_limits.max_new_tokens = 32;
  so.max_message_bytes = 1024;
  Start(so);
  auto stub = v1::ModServe::NewStub(PlainChannel());
  struct Case {
    v1::GenerateRequest request;
    grpc::StatusCode code;
    std::string message;
  };
  // 1200 prompt ids take at least 1200 bytes on the wire, over the 1024-byte limit.
  const std::vector<Case> cases = {
      {TokenRequest(9, 4), grpc::StatusCode::OUT_OF_RANGE,
       "prompt: 9 tokens exceeds --max_prompt_tokens=8"},
      {TokenRequest(8, 33), grpc::StatusCode::OUT_OF_RANGE,
       "stopping.max_new_tokens: 33 exceeds --max_new_tokens=32"},
      {TokenRequest(1200, 4), grpc::StatusCode::RESOURCE_EXHAUSTED, "vs. 1024)"},
  };
  for (const Case& c : cases) {
    const grpc::Status unary = CallGenerate(*stub, c.request);
    EXPECT_EQ(unary.error_code(), c.code) << c.message;
    EXPECT_THAT(unary.error_message(), HasSubstr(c.message));
    const grpc::Status stream = CallStream(*stub, c.request);
    EXPECT_EQ(stream.error_code(), c.code) << c.message;
    EXPECT_THAT(stream.error_message(), HasSubstr(c.message));
  }
  int num_tokens = 0;
  EXPECT_TRUE(CallStream(*stub, TokenRequest(8, 32), "", &num_tokens).ok());
  EXPECT_EQ(num_tokens, 32);
}

TEST_F(ServerSecurityTest, ConcurrentCallLimitRefusesOnePastItAndAdmitsAfterOneEnds) {
  ServerOptions so = Options();
  so.max_concurrent_streams = 2;
  Start(so);
  auto stub = v1::ModServe::NewStub(PlainChannel());
  gate_.Close();  // the engine makes no progress, so admitted calls stay in flight
  grpc::ClientContext a_ctx, b_ctx;
  Prepare(&a_ctx);
  Prepare(&b_ctx);
  auto a = stub->GenerateStream(&a_ctx, TokenRequest(3, 4));
  auto b = stub->GenerateStream(&b_ctx, TokenRequest(3, 4));
  while (server_->call_gate().num_generations() < 2) std::this_thread::yield();
  for (bool streaming : {false, true}) {
    const grpc::Status refused = streaming ? CallStream(*stub, TokenRequest(3, 4))
                                           : CallGenerate(*stub, TokenRequest(3, 4));
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.error_message(), HasSubstr("at most --max_concurrent_streams=2"));
  }
  EXPECT_EQ(server_->call_gate().num_generations(), 2);  // refusals hold no slot
  gate_.Open();
  v1::GenerateStreamResponse msg;
  while (a->Read(&msg)) {
  }
  EXPECT_TRUE(a->Finish().ok());
  // The slot comes back when the server side of the call is over, just after the client's end.
  while (server_->call_gate().num_generations() > 1) std::this_thread::yield();
  int num_tokens = 0;
  EXPECT_TRUE(CallStream(*stub, TokenRequest(3, 4), "", &num_tokens).ok());
  EXPECT_EQ(num_tokens, 4);
  while (b->Read(&msg)) {
  }
  EXPECT_TRUE(b->Finish().ok());
}

TEST_F(ServerSecurityTest, BadCredentialFilesFailStartNamingFlagAndFile) {
  const std::string missing = absl::StrCat(dir_.path(), "/missing.pem");
  const std::string empty = absl::StrCat(dir_.path(), "/empty");
  std::ofstream(empty).flush();
  struct Case {
    TlsOptions tls;
    std::string token_file;
    std::string message;
  };
  const std::string& cert = certs_.server_cert.path;
  const std::string& key = certs_.server_key.path;
  const std::vector<Case> cases = {
      {{missing, key, ""}, "", absl::StrCat("--tls_cert_file: '", missing, "' cannot be opened")},
      {{cert, missing, ""}, "", absl::StrCat("--tls_key_file: '", missing, "' cannot be opened")},
      {{cert, empty, ""}, "", absl::StrCat("--tls_key_file: '", empty, "' is empty")},
      {{cert, key, missing}, "", absl::StrCat("--tls_client_ca_file: '", missing, "'")},
      {{key, key, ""}, "", absl::StrCat("--tls_cert_file: '", key, "' holds no PEM certificate")},
      {{cert, cert, ""}, "", absl::StrCat("--tls_key_file: '", cert, "' holds no unencrypted")},
      {{cert, certs_.client_key.path, ""}, "", "is not the key of the certificate"},
      {{cert, key, key}, "", absl::StrCat("--tls_client_ca_file: '", key, "' holds no PEM")},
      {{cert, "", ""}, "", "--tls_cert_file needs --tls_key_file"},
      {{"", key, ""}, "", "need --tls_cert_file"},
      {{}, missing, absl::StrCat("--auth_token_file: '", missing, "' cannot be opened")},
      {{}, empty, absl::StrCat("--auth_token_file: '", empty, "' is empty")},
  };
  for (const Case& c : cases) {
    ServerOptions so = Options();
    so.tls = c.tls;
    so.auth_token_file = c.token_file;
    EXPECT_THAT(Server::Start(so, EngineOpts()),
                StatusIs(absl::StatusCode::kInvalidArgument, c.message));
  }
}

}  // namespace
}  // namespace modserve::server
