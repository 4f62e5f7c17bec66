// modserve-client: a command-line client of the ModServe gRPC API (generate, stream, tokenize,
// detokenize, info, health). It holds no model and does no tokenization of its own.
//
//   modserve-client --server 127.0.0.1:50051 stream --prompt "Once upon a time"
//   modserve-client generate --prompt_ids 1,17,42 --max_new_tokens 8 --json
//   modserve-client health
//   modserve-client --tls_ca_file ca.crt --auth_token_file token info
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "tools/cli_usage.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "gRPC target: host:port, IPv4 host:port,host:port,... (several replicas), or a URI "
          "(ipv4:, ipv6:, dns:///name:port)");
ABSL_FLAG(std::string, lb_policy, "pick_first",
          "pick_first or round_robin over the target's addresses");
ABSL_FLAG(int32_t, retries, 0,
          "gRPC retry policy: resend a call that got UNAVAILABLE up to N times (at most 4); a "
          "stream only until its first message");
ABSL_FLAG(std::string, prompt, "", "prompt text (generate, stream, tokenize)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt token ids, comma separated (instead of --prompt)");
ABSL_FLAG(int32_t, max_new_tokens, 64, "tokens to generate at most");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(int32_t, top_k, 0, "0 = off");
ABSL_FLAG(double, top_p, 1.0, "1 = off");
ABSL_FLAG(int64_t, seed, -1, "sampling seed; -1 = the server draws one");
ABSL_FLAG(double, threshold, -1.0, "routing threshold override; -1 = the model's");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings, comma separated");
ABSL_FLAG(bool, ignore_eos, false, "keep generating after EOS");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(120), "deadline of each call");
ABSL_FLAG(bool, stats, false, "print usage, timings and routing after the text");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA that signed the server's certificate; setting any --tls_* flag turns TLS on "
          "(without this one, the system's roots)");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM client certificate (servers that require one)");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, auth_token_file, "",
          "file whose first line is the bearer token sent as 'authorization: Bearer <token>'");

namespace {

namespace v1 = modserve::v1;

int Fail(const std::string& what) {
  std::cerr << "modserve-client: " << what << std::endl;
  return 1;
}

int FailRpc(const grpc::Status& s) {
  return Fail("RPC failed: code " + std::to_string(s.error_code()) + ": " + s.error_message());
}

// A comma-separated list without a scheme is what gRPC's ipv4: resolver takes; the default dns:
// resolver would read it as one host name.
std::string NormalizeTarget(const std::string& target) {
  if (!absl::StrContains(target, ',')) return target;
  for (const char* scheme : {"ipv4:", "ipv6:", "dns:", "unix:", "unix-abstract:"}) {
    if (absl::StartsWith(target, scheme)) return target;
  }
  return "ipv4:" + target;
}

// gRPC's own retry: it resends a call until the call is committed (a response message arrived),
// so unary calls are retried whole and a stream only before its first token.
std::string RetryServiceConfig(int32_t retries) {
  return absl::StrCat(R"({"methodConfig":[{"name":[{"service":"modserve.v1.ModServe"},)",
                      R"({"service":"grpc.health.v1.Health"}],"retryPolicy":{"maxAttempts":)",
                      retries + 1,
                      R"(,"initialBackoff":"0.1s","maxBackoff":"1s","backoffMultiplier":2,)",
                      R"("retryableStatusCodes":["UNAVAILABLE"]}}]})");
}

// The whole file, or false with `error` naming the flag.
bool ReadFile(const std::string& flag, const std::string& path, std::string* out,
              std::string* error) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  if (!in || buf.str().empty()) {
    *error = flag + ": cannot read '" + path + "' (missing, unreadable or empty)";
    return false;
  }
  *out = buf.str();
  return true;
}

bool ChannelCredentials(std::shared_ptr<grpc::ChannelCredentials>* out, std::string* error) {
  const std::string ca = absl::GetFlag(FLAGS_tls_ca_file);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key = absl::GetFlag(FLAGS_tls_key_file);
  if (ca.empty() && cert.empty() && key.empty()) {
    *out = grpc::InsecureChannelCredentials();
    return true;
  }
  if (cert.empty() != key.empty()) {
    *error = "give both --tls_cert_file and --tls_key_file, or neither";
    return false;
  }
  grpc::SslCredentialsOptions o;
  if (!ca.empty() && !ReadFile("--tls_ca_file", ca, &o.pem_root_certs, error)) return false;
  if (!cert.empty() && !ReadFile("--tls_cert_file", cert, &o.pem_cert_chain, error)) return false;
  if (!key.empty() && !ReadFile("--tls_key_file", key, &o.pem_private_key, error)) return false;
  *out = grpc::SslCredentials(o);
  return true;
}

// "Bearer <first line of --auth_token_file>", or "" without the flag.
bool Authorization(std::string* out, std::string* error) {
  const std::string path = absl::GetFlag(FLAGS_auth_token_file);
  if (path.empty()) return true;
  std::string data;
  if (!ReadFile("--auth_token_file", path, &data, error)) return false;
  const std::string token(absl::StripAsciiWhitespace(data.substr(0, data.find('\n'))));
  if (token.empty()) {
    *error = "--auth_token_file: '" + path + "' has no token on its first line";
    return false;
  }
  *out = "Bearer " + token;
  return true;
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_timeout)));
}

bool BuildRequest(v1::GenerateRequest* req, std::string* error) {
  const std::string text = absl::GetFlag(FLAGS_prompt);
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  if (text.empty() == ids.empty()) {
    *error = "give exactly one of --prompt and --prompt_ids";
    return false;
  }
  if (!text.empty()) {
    req->set_prompt(text);
  } else {
    for (absl::string_view part : absl::StrSplit(ids, ',', absl::SkipWhitespace())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) {
        *error = "--prompt_ids: '" + std::string(part) + "' is not a token id";
        return false;
      }
      req->mutable_prompt_token_ids()->add_ids(id);
    }
  }
  v1::SamplingParams* s = req->mutable_sampling();
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  if (absl::GetFlag(FLAGS_top_k) > 0) s->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (absl::GetFlag(FLAGS_top_p) != 1.0)
    s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  if (absl::GetFlag(FLAGS_seed) >= 0) s->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  req->mutable_stopping()->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) req->mutable_stopping()->add_stop(stop);
  req->mutable_stopping()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  if (absl::GetFlag(FLAGS_threshold) != -1.0) {
    req->mutable_routing()->set_threshold(absl::GetFlag(FLAGS_threshold));
  }
  return true;
}

template <typename Response>
void PrintStats(const Response& r) {
  std::cerr << "finish_reason: " << v1::FinishReason_Name(r.finish_reason())
            << "  prompt_tokens: " << r.usage().prompt_tokens()
            << "  completion_tokens: " << r.usage().completion_tokens() << "\n"
            << "ttft: " << r.timings().first_token_seconds()
            << " s  total: " << r.timings().total_seconds()
            << " s  queue: " << r.timings().queue_seconds() << " s\n";
  for (const auto& layer : r.routing().layers()) {
    std::cerr << "layer " << layer.layer() << ": computed " << layer.tokens_computed() << " of "
              << layer.tokens_total() << " (" << layer.computed_fraction() << ")\n";
  }
  std::cerr << "kv bytes: " << r.routing().kv_bytes() << " (dense: " << r.routing().kv_bytes_dense()
            << ")" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  modserve::cli::SetUsage(
      "modserve-client [--server HOST:PORT] generate|stream|tokenize|detokenize|info|health "
      "[--prompt TEXT | --prompt_ids IDS] ...",
      __FILE__);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2)
    return Fail(
        "give one command: generate, stream, tokenize, detokenize, "
        "info or health");
  const std::string command = args[1];
  const std::string lb_policy = absl::GetFlag(FLAGS_lb_policy);
  if (lb_policy != "pick_first" && lb_policy != "round_robin") {
    return Fail("--lb_policy '" + lb_policy + "' is not pick_first or round_robin");
  }
  const int32_t retries = absl::GetFlag(FLAGS_retries);
  if (retries < 0 || retries > 4) {
    return Fail("--retries " + std::to_string(retries) + " is outside [0, 4] (gRPC's limit)");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string authorization, error;
  if (!ChannelCredentials(&credentials, &error) || !Authorization(&authorization, &error)) {
    return Fail(error);
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetLoadBalancingPolicyName(lb_policy);
  if (retries > 0) channel_args.SetServiceConfigJSON(RetryServiceConfig(retries));
  auto channel = grpc::CreateCustomChannel(NormalizeTarget(absl::GetFlag(FLAGS_server)),
                                           credentials, channel_args);
  auto stub = v1::ModServe::NewStub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);

  if (command == "generate" || command == "stream") {
    v1::GenerateRequest req;
    std::string error;
    if (!BuildRequest(&req, &error)) return Fail(error);
    if (command == "generate") {
      v1::GenerateResponse resp;
      grpc::Status s = stub->Generate(&ctx, req, &resp);
      if (!s.ok()) return FailRpc(s);
      if (req.has_prompt()) {
        std::cout << resp.text() << std::endl;
      } else {
        std::cout << absl::StrJoin(resp.token_ids(), ",") << std::endl;
      }
      if (absl::GetFlag(FLAGS_stats)) PrintStats(resp);
      return 0;
    }
    auto reader = stub->GenerateStream(&ctx, req);
    v1::GenerateStreamResponse msg, last;
    bool first = true;
    while (reader->Read(&msg)) {
      // Text arrives as whole UTF-8 characters, so each chunk can be printed as it comes.
      if (req.has_prompt()) {
        std::cout << msg.text() << std::flush;
      } else {
        for (int32_t id : msg.token_ids()) {
          std::cout << (first ? "" : ",") << id << std::flush;
          first = false;
        }
      }
      last = msg;
    }
    std::cout << std::endl;
    grpc::Status s = reader->Finish();
    if (!s.ok()) return FailRpc(s);
    if (absl::GetFlag(FLAGS_stats)) PrintStats(last);
    return 0;
  }
  if (command == "tokenize") {
    v1::TokenizeRequest req;
    req.set_text(absl::GetFlag(FLAGS_prompt));
    req.set_add_special_tokens(true);
    v1::TokenizeResponse resp;
    grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    if (!s.ok()) return FailRpc(s);
    std::cout << absl::StrJoin(resp.token_ids(), ",") << std::endl;
    return 0;
  }
  if (command == "detokenize") {
    v1::DetokenizeRequest req;
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',', absl::SkipWhitespace())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id))
        return Fail("--prompt_ids: bad id '" + std::string(part) + "'");
      req.add_token_ids(id);
    }
    v1::DetokenizeResponse resp;
    grpc::Status s = stub->Detokenize(&ctx, req, &resp);
    if (!s.ok()) return FailRpc(s);
    std::cout << resp.text() << std::endl;
    return 0;
  }
  if (command == "info") {
    v1::GetModelInfoResponse resp;
    grpc::Status s = stub->GetModelInfo(&ctx, {}, &resp);
    if (!s.ok()) return FailRpc(s);
    std::cout << resp.DebugString();
    return 0;
  }
  if (command == "health") {
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, req, &resp);
    if (!s.ok()) return FailRpc(s);
    std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())
              << std::endl;
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }
  return Fail("unknown command '" + command + "'");
}
