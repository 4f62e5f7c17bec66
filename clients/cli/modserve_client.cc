// modserve-client: a command-line client of the ModServe gRPC API (generate, stream, tokenize,
// detokenize, info, health). It holds no model and does no tokenization of its own.
//
//   modserve-client --server 127.0.0.1:50051 stream --prompt "Once upon a time"
//   modserve-client generate --prompt_ids 1,17,42 --max_new_tokens 8 --json
//   modserve-client health
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "modserve/v1/modserve.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "host:port of the modserve server");
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

namespace {

namespace v1 = modserve::v1;

int Fail(const std::string& what) {
  std::cerr << "modserve-client: " << what << std::endl;
  return 1;
}

int FailRpc(const grpc::Status& s) {
  return Fail("RPC failed: code " + std::to_string(s.error_code()) + ": " + s.error_message());
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
  absl::SetProgramUsageMessage(
      "modserve-client [--server HOST:PORT] generate|stream|tokenize|detokenize|info|health "
      "[--prompt TEXT | --prompt_ids IDS] ...");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2)
    return Fail(
        "give one command: generate, stream, tokenize, detokenize, "
        "info or health");
  const std::string command = args[1];
  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  auto stub = v1::ModServe::NewStub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);

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
