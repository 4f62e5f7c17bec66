// OpenAiService. One Job per completion request: its choices' sinks (engine thread) append
// events to a mutex-guarded list and post one drain to the connection; the drain (HTTP thread)
// turns them into JSON. A unary job answers when every choice is done; a streamed one writes one
// SSE event per token. The client going away cancels every choice, which frees their KV pages
// in the loop's next iteration, as a gRPC cancel does.
#include "server/openai_service.h"

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/common/logging.h"
#include "engine/sampler/stop_checker.h"
#include "nlohmann/json.hpp"

namespace modserve::server {

using json = nlohmann::ordered_json;

namespace {

std::string Dump(const json& j) {
  // Replace rather than throw: every string here is valid UTF-8, but a reply must never fail.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string RandomId(absl::string_view prefix) {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%s%016x%08x", prefix, absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint32_t>(gen));
}

const char* OpenAiFinishReason(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kStopToken:
    case engine::FinishReason::kStopString:
      return "stop";
    case engine::FinishReason::kCancelled:
    case engine::FinishReason::kError:
      break;
  }
  return "stop";
}

json RoutingJson(const engine::FinishedRequest& done) {
  const engine::GenerationResult& r = done.result;
  json layers = json::array();
  for (size_t k = 0; k < r.routed_layers.size() && k < r.routing.size(); ++k) {
    int64_t computed = 0;
    for (uint8_t x : r.routing[k]) computed += x;
    const int64_t total = static_cast<int64_t>(r.routing[k].size());
    layers.push_back(
        {{"layer", r.routed_layers[k]},
         {"tokens_total", total},
         {"tokens_computed", computed},
         {"computed_fraction", total > 0 ? static_cast<double>(computed) / total : 0.0}});
  }
  return {{"threshold", done.threshold},
          {"kv_bytes", r.kv_bytes},
          {"kv_bytes_dense", r.kv_bytes_dense},
          {"layers", std::move(layers)}};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// A completion request in flight.

class OpenAiService::Job : public std::enable_shared_from_this<OpenAiService::Job> {
 public:
  Job(OpenAiService* service, std::shared_ptr<HttpExchange> exchange, OpenAiRequest request,
      std::string id, bool holds_slot)
      : service_(service),
        exchange_(std::move(exchange)),
        endpoint_(request.endpoint),
        stream_(request.stream),
        include_usage_(request.include_usage),
        echo_(request.echo),
        logprobs_(request.logprobs),
        return_routing_(request.return_routing),
        id_(std::move(id)),
        created_(absl::ToUnixSeconds(absl::Now())),
        holds_slot_(holds_slot) {
    service_->num_in_flight_.fetch_add(1);
    choices_.resize(request.requests.size());
    for (size_t i = 0; i < choices_.size(); ++i) {
      choices_[i].prompt_tokens = static_cast<int32_t>(request.requests[i].request.prompt.size());
      choices_[i].prompt = request.requests[i].request.prompt;
      if (i < request.prompt_texts.size()) choices_[i].prompt_text = request.prompt_texts[i];
    }
  }
  ~Job() {
    ReleaseSlot();
    service_->num_in_flight_.fetch_sub(1);
  }

  // Engine thread: queue and hand over; never formats, never blocks on the network.
  void OnToken(size_t choice, const engine::TokenEvent& event) {
    if (!stream_) return;  // a unary reply is built from the final result
    Queue({choice, event, std::nullopt});
  }
  void OnDone(size_t choice, absl::StatusOr<engine::FinishedRequest> done) {
    Queue({choice, std::nullopt, std::move(done)});
  }

  // HTTP thread (the connection's strand) from here on.
  void AddHandle(std::shared_ptr<engine::RequestHandle> handle) {
    handles_.push_back(std::move(handle));
  }
  void CancelAll() {
    for (const auto& h : handles_) h->Cancel();
  }
  // Submission of choice `failed_at` failed: the ones before it are cancelled and the request
  // is answered with `status` now; their OnDone (Cancelled) changes nothing later.
  void AbortSubmission(const absl::Status& status) {
    CancelAll();
    finished_ = true;
    service_->Fail(*exchange_, status, id_);
    if (handles_.empty()) ReleaseSlot();
  }
  void Begin() {
    if (stream_) exchange_->StartStream(200, "text/event-stream");
  }

 private:
  struct Event {
    size_t choice;
    std::optional<engine::TokenEvent> token;
    std::optional<absl::StatusOr<engine::FinishedRequest>> done;
  };
  struct Choice {
    int32_t prompt_tokens = 0;
    std::vector<int32_t> prompt;
    std::string prompt_text;
    bool started = false;     // the first chunk (role, echo) went out
    int64_t text_offset = 0;  // characters of text so far (completions logprobs)
    int32_t completion_tokens = 0;
    std::optional<engine::FinishedRequest> result;
    bool done = false;
  };

  void Queue(Event e) {
    bool post;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(std::move(e));
      post = !drain_posted_;
      drain_posted_ = true;
    }
    if (post) exchange_->Post([self = shared_from_this()] { self->Drain(); });
  }

  void Drain() {
    std::vector<Event> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events.swap(pending_);
      drain_posted_ = false;
    }
    for (Event& e : events) {
      if (!e.token) {
        // The slot goes back when every submitted choice has ended in the engine (which, once
        // the response is complete, is what a client waiting to send the next request sees).
        if (++num_ended_ == handles_.size()) ReleaseSlot();
      }
      if (finished_) continue;
      if (e.token) {
        StreamToken(e.choice, *e.token);
      } else {
        Done(e.choice, std::move(*e.done));
      }
    }
  }

  void ReleaseSlot() {
    if (holds_slot_ && !slot_released_ && service_->gate_ != nullptr) {
      slot_released_ = true;
      service_->gate_->ReleaseGeneration();
    }
  }

  void Done(size_t index, absl::StatusOr<engine::FinishedRequest> done) {
    Choice& c = choices_[index];
    c.done = true;
    ++num_done_;
    if (!done.ok()) {
      // One choice failing ends the request: the others are cancelled.
      CancelAll();
      finished_ = true;
      if (done.status().code() == absl::StatusCode::kInternal) {
        MODSERVE_LOG(ERROR) << "request '" << id_ << "': " << done.status();
      }
      if (!stream_) return service_->Fail(*exchange_, done.status(), id_);
      exchange_->Write(absl::StrCat("data: ", ErrorJson(done.status()), "\n\ndata: [DONE]\n\n"));
      exchange_->End();
      return;
    }
    c.result = *std::move(done);
    if (stream_) StreamFinish(index);
    if (num_done_ < choices_.size()) return;
    finished_ = true;
    if (!stream_) return ReplyUnary();
    if (include_usage_) {
      json chunk = Envelope();
      chunk["choices"] = json::array();
      chunk["usage"] = Usage();
      exchange_->Write(absl::StrCat("data: ", Dump(chunk), "\n\n"));
    }
    exchange_->Write("data: [DONE]\n\n");
    exchange_->End();
  }

  json Envelope() const {
    const bool chat = endpoint_ == OpenAiEndpoint::kChatCompletions;
    json out = {{"id", id_},
                {"object", chat ? (stream_ ? "chat.completion.chunk" : "chat.completion")
                                : "text_completion"},
                {"created", created_},
                {"model", service_->model_.name}};
    return out;
  }

  json Usage() const {
    int64_t prompt = 0, completion = 0;
    for (const Choice& c : choices_) {
      prompt += c.prompt_tokens;
      completion +=
          c.result ? static_cast<int64_t>(c.result->result.token_ids.size()) : c.completion_tokens;
    }
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  }

  std::string TokenText(int32_t id) const {
    const engine::Tokenizer* tok = service_->engine_->tokenizer();
    if (tok == nullptr) return absl::StrCat("<", id, ">");
    absl::StatusOr<std::string> text = tok->Decode({id}, /*skip_special_tokens=*/false);
    return text.ok() ? *std::move(text) : std::string();
  }

  static int64_t Characters(absl::string_view s) {
    int64_t n = 0;
    for (unsigned char b : s) n += (b & 0xc0) != 0x80;
    return n;
  }

  // The echoed prompt's entries: each prompt token, its logprob (none for the first) and its
  // alternatives.
  static void AddPromptEntries(const std::vector<engine::PromptLogprob>& prompt,
                               std::vector<int32_t>* tokens,
                               std::vector<std::optional<float>>* lps,
                               std::vector<std::vector<engine::TokenLogprob>>* tops) {
    for (const engine::PromptLogprob& p : prompt) {
      tokens->push_back(p.token);
      lps->push_back(p.logprob);
      tops->push_back(p.top);
    }
  }

  // Completions' logprobs object for `tokens` (text_offset from `offset`, advanced).
  json CompletionLogprobs(const std::vector<int32_t>& tokens,
                          const std::vector<std::optional<float>>& logprobs,
                          const std::vector<std::vector<engine::TokenLogprob>>& tops,
                          int64_t* offset) const {
    json out = {{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string text = TokenText(tokens[i]);
      out["tokens"].push_back(text);
      out["text_offset"].push_back(*offset);
      *offset += Characters(text);
      if (!logprobs[i]) {
        out["token_logprobs"].push_back(nullptr);
        out["top_logprobs"].push_back(nullptr);
        continue;
      }
      out["token_logprobs"].push_back(*logprobs[i]);
      json top = json::object();
      for (size_t k = 0; k < tops[i].size() && static_cast<int32_t>(k) < logprobs_; ++k) {
        const std::string alt = TokenText(tops[i][k].id);
        if (!top.contains(alt)) top[alt] = tops[i][k].logprob;
      }
      // As vLLM does: the chosen token is always among its alternatives.
      if (!top.contains(text)) top[text] = *logprobs[i];
      out["top_logprobs"].push_back(std::move(top));
    }
    return out;
  }

  json ChatLogprobContent(const std::vector<int32_t>& tokens, const std::vector<float>& logprobs,
                          const std::vector<std::vector<engine::TokenLogprob>>& tops) const {
    auto bytes = [](const std::string& s) {
      json b = json::array();
      for (unsigned char c : s) b.push_back(static_cast<int>(c));
      return b;
    };
    json content = json::array();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string text = TokenText(tokens[i]);
      json top = json::array();
      for (size_t k = 0;
           i < tops.size() && k < tops[i].size() && static_cast<int32_t>(k) < logprobs_; ++k) {
        const std::string alt = TokenText(tops[i][k].id);
        top.push_back({{"token", alt}, {"logprob", tops[i][k].logprob}, {"bytes", bytes(alt)}});
      }
      content.push_back({{"token", text},
                         {"logprob", logprobs[i]},
                         {"bytes", bytes(text)},
                         {"top_logprobs", std::move(top)}});
    }
    return content;
  }

  void ReplyUnary() {
    const bool chat = endpoint_ == OpenAiEndpoint::kChatCompletions;
    json out = Envelope();
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      const engine::GenerationResult& r = c.result->result;
      json choice = {{"index", i}};
      json logprobs = nullptr;
      if (logprobs_ >= 0) {
        std::vector<std::vector<engine::TokenLogprob>> tops = r.top_logprobs;
        tops.resize(r.token_ids.size());
        if (chat) {
          logprobs = {{"content", ChatLogprobContent(r.token_ids, r.logprobs, tops)},
                      {"refusal", nullptr}};
        } else {
          // With echo, the prompt's tokens come first (the first without a logprob).
          std::vector<int32_t> tokens;
          std::vector<std::optional<float>> lps;
          std::vector<std::vector<engine::TokenLogprob>> all_tops;
          if (echo_) AddPromptEntries(r.prompt_logprobs, &tokens, &lps, &all_tops);
          tokens.insert(tokens.end(), r.token_ids.begin(), r.token_ids.end());
          lps.insert(lps.end(), r.logprobs.begin(), r.logprobs.end());
          all_tops.insert(all_tops.end(), tops.begin(), tops.end());
          int64_t offset = 0;
          logprobs = CompletionLogprobs(tokens, lps, all_tops, &offset);
        }
      }
      if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", r.text}};
      } else {
        choice["text"] = echo_ ? c.prompt_text + r.text : r.text;
      }
      choice["logprobs"] = std::move(logprobs);
      choice["finish_reason"] = OpenAiFinishReason(r.finish_reason);
      if (return_routing_) choice["routing"] = RoutingJson(*c.result);
      choices.push_back(std::move(choice));
    }
    out["choices"] = std::move(choices);
    out["usage"] = Usage();
    exchange_->Reply(200, "application/json", Dump(out));
  }

  // One SSE event for one sampled token.
  void StreamToken(size_t index, const engine::TokenEvent& e) {
    const bool chat = endpoint_ == OpenAiEndpoint::kChatCompletions;
    Choice& c = choices_[index];
    ++c.completion_tokens;
    json choice = {{"index", index}};
    std::string text = e.text;
    const bool first_event = !c.started;
    if (!c.started) {
      c.started = true;
      if (echo_) {
        text = c.prompt_text + text;
      }
      if (chat) {
        // OpenAI's first delta carries the role alone.
        json first = Envelope();
        first["choices"] = json::array({{{"index", index},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
        if (include_usage_) first["usage"] = nullptr;
        exchange_->Write(absl::StrCat("data: ", Dump(first), "\n\n"));
      }
    }
    json logprobs = nullptr;
    if (logprobs_ >= 0) {
      if (chat) {
        logprobs = {{"content", ChatLogprobContent({e.token}, {e.logprob}, {e.top_logprobs})},
                    {"refusal", nullptr}};
      } else {
        std::vector<int32_t> tokens;
        std::vector<std::optional<float>> lps;
        std::vector<std::vector<engine::TokenLogprob>> tops;
        if (first_event && echo_) AddPromptEntries(e.prompt_logprobs, &tokens, &lps, &tops);
        tokens.push_back(e.token);
        lps.push_back(e.logprob);
        tops.push_back(e.top_logprobs);
        logprobs = CompletionLogprobs(tokens, lps, tops, &c.text_offset);
      }
    } else if (chat && text.empty()) {
      return;  // nothing to show yet (held bytes of a character, or of a stop string)
    }
    if (chat) {
      choice["delta"] = {{"content", text}};
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = nullptr;
    json chunk = Envelope();
    chunk["choices"] = json::array({std::move(choice)});
    if (include_usage_) chunk["usage"] = nullptr;
    exchange_->Write(absl::StrCat("data: ", Dump(chunk), "\n\n"));
  }

  // The choice's last event: finish_reason (and the routing summary when asked).
  void StreamFinish(size_t index) {
    const bool chat = endpoint_ == OpenAiEndpoint::kChatCompletions;
    Choice& c = choices_[index];
    json choice = {{"index", index}};
    if (chat) {
      choice["delta"] = json::object();
    } else {
      choice["text"] = !c.started && echo_ ? c.prompt_text : "";
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = OpenAiFinishReason(c.result->result.finish_reason);
    if (return_routing_) choice["routing"] = RoutingJson(*c.result);
    json chunk = Envelope();
    chunk["choices"] = json::array({std::move(choice)});
    if (include_usage_) chunk["usage"] = nullptr;
    exchange_->Write(absl::StrCat("data: ", Dump(chunk), "\n\n"));
  }

  OpenAiService* const service_;
  const std::shared_ptr<HttpExchange> exchange_;
  const OpenAiEndpoint endpoint_;
  const bool stream_;
  const bool include_usage_;
  const bool echo_;
  const int32_t logprobs_;
  const bool return_routing_;
  const std::string id_;
  const int64_t created_;
  const bool holds_slot_;

  std::mutex mu_;
  std::vector<Event> pending_;  // guarded by mu_
  bool drain_posted_ = false;   // guarded by mu_

  // The connection's strand only.
  std::vector<Choice> choices_;
  std::vector<std::shared_ptr<engine::RequestHandle>> handles_;
  size_t num_done_ = 0;   // choices done while the response was being written
  size_t num_ended_ = 0;  // choices whose OnDone arrived, whatever the response's state
  bool finished_ = false;
  bool slot_released_ = false;
};

namespace {

// One choice's sink: forwards to its job (shared by the choices).
class ChoiceSink final : public engine::GenerationSink {
 public:
  ChoiceSink(std::shared_ptr<OpenAiService::Job> job, size_t index)
      : job_(std::move(job)), index_(index) {}
  void OnToken(const engine::TokenEvent& event) override;
  void OnDone(absl::StatusOr<engine::FinishedRequest> result) override;

 private:
  std::shared_ptr<OpenAiService::Job> job_;
  const size_t index_;
};

}  // namespace

// (Job is complete above; the sink's methods need it.)
void ChoiceSink::OnToken(const engine::TokenEvent& event) { job_->OnToken(index_, event); }
void ChoiceSink::OnDone(absl::StatusOr<engine::FinishedRequest> result) {
  // The last call: let go of the job. The loop's request handle keeps this sink alive and the
  // job keeps the handles, so holding on would keep the job (and its exchange) forever.
  std::shared_ptr<OpenAiService::Job> job = std::move(job_);
  job->OnDone(index_, std::move(result));
}

// ---------------------------------------------------------------------------------------------

OpenAiService::OpenAiService(const engine::Engine* engine, engine::StepLoop* loop, Metrics* metrics,
                             CallGate* gate, const ChatTemplate* chat_template,
                             std::string model_name, absl::Status chat_template_status)
    : engine_(engine),
      loop_(loop),
      metrics_(metrics),
      gate_(gate),
      created_(absl::ToUnixSeconds(absl::Now())) {
  model_.name = std::move(model_name);
  model_.config = &engine->config();
  model_.tokenizer = engine->tokenizer();
  model_.chat_template = chat_template;
  model_.chat_template_status = std::move(chat_template_status);
  if (gate != nullptr) model_.limits = gate->request_limits();
}

void OpenAiService::Fail(HttpExchange& exchange, const absl::Status& status,
                         absl::string_view request_id) {
  if (HttpStatusFor(status) == 500) {
    MODSERVE_LOG(ERROR) << "request '" << request_id << "': " << status;
  }
  HttpHeaders headers;
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    headers.emplace_back("WWW-Authenticate", "Bearer");
  }
  exchange.Reply(HttpStatusFor(status), "application/json", ErrorJson(status), headers);
}

void OpenAiService::Handle(HttpRequest& request, std::shared_ptr<HttpExchange> exchange) {
  const std::string& path = request.path;
  auto method_is = [&](absl::string_view want) {
    if (request.method == want) return true;
    exchange->Reply(405, "application/json",
                    ErrorJson(absl::InvalidArgumentError(
                        absl::StrCat(request.method, " is not allowed on ", path, "; use ", want))),
                    {{"Allow", std::string(want)}});
    return false;
  };
  if (path == "/health") {
    if (method_is("GET")) Health(*exchange);
    return;
  }
  const bool known = path == "/v1/completions" || path == "/v1/chat/completions" ||
                     path == "/v1/models" || absl::StartsWith(path, "/v1/models/") ||
                     path == "/tokenize" || path == "/detokenize" || path == "/tokenizer_info";
  if (!known) {
    exchange->Reply(404, "application/json",
                    ErrorJson(absl::NotFoundError(absl::StrCat(
                        "no route for ", request.method, " ", path,
                        " (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                        "GET /health, POST /tokenize, POST /detokenize, GET /tokenizer_info)"))));
    return;
  }
  if (gate_ != nullptr) {
    const absl::Status auth = gate_->CheckToken(request.Headers("authorization"));
    if (!auth.ok()) return Fail(*exchange, auth, "");
  }
  if (path == "/v1/completions") {
    if (method_is("POST")) Generate(OpenAiEndpoint::kCompletions, request, exchange);
  } else if (path == "/v1/chat/completions") {
    if (method_is("POST")) Generate(OpenAiEndpoint::kChatCompletions, request, exchange);
  } else if (path == "/tokenize") {
    if (method_is("POST")) Tokenize(request, *exchange);
  } else if (path == "/detokenize") {
    if (method_is("POST")) Detokenize(request, *exchange);
  } else if (path == "/tokenizer_info") {
    if (method_is("GET")) TokenizerInfo(*exchange);
  } else if (method_is("GET")) {
    Models(request, *exchange);
  }
}

void OpenAiService::Generate(OpenAiEndpoint endpoint, HttpRequest& request,
                             std::shared_ptr<HttpExchange> exchange) {
  const std::string id =
      RandomId(endpoint == OpenAiEndpoint::kChatCompletions ? "chatcmpl-" : "cmpl-");
  const bool holds_slot = gate_ != nullptr;
  if (gate_ != nullptr) {
    const absl::Status slot = gate_->AcquireGeneration();  // counts its own refusal
    if (!slot.ok()) return Fail(*exchange, slot, id);
  }
  absl::StatusOr<OpenAiRequest> parsed =
      ParseOpenAiRequest(endpoint, request.body, model_, absl::InfiniteFuture());
  if (!parsed.ok()) {
    if (holds_slot) gate_->ReleaseGeneration();
    if (metrics_ != nullptr) metrics_->CountFailure(parsed.status().code());
    return Fail(*exchange, parsed.status(), id);
  }
  // The client's request id, when it sends one, names the request in the server log.
  std::string log_id(request.Header("x-request-id").substr(0, kMaxRequestIdBytes));
  if (log_id.empty()) log_id = id;
  std::vector<engine::LoopRequest> requests = std::move(parsed->requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].request_id = requests.size() == 1 ? log_id : absl::StrCat(log_id, "/", i);
  }
  parsed->requests.clear();
  // The job needs the prompts for usage and echo; the requests themselves move to the loop.
  OpenAiRequest meta = *std::move(parsed);
  meta.requests = requests;
  auto job = std::make_shared<Job>(this, exchange, std::move(meta), id, holds_slot);
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<std::shared_ptr<engine::RequestHandle>> handle =
        loop_->Submit(std::move(requests[i]), std::make_shared<ChoiceSink>(job, i));
    if (!handle.ok()) {
      if (metrics_ != nullptr) metrics_->CountFailure(handle.status().code());
      return job->AbortSubmission(handle.status());
    }
    job->AddHandle(*std::move(handle));
  }
  std::weak_ptr<Job> weak = job;
  exchange->OnClose([weak] {
    if (std::shared_ptr<Job> j = weak.lock()) j->CancelAll();
  });
  job->Begin();
}

void OpenAiService::Tokenize(HttpRequest& request, HttpExchange& exchange) {
  json body;
  try {
    body = json::parse(request.body);
  } catch (const json::exception& e) {
    return Fail(exchange,
                absl::InvalidArgumentError(absl::StrCat("body: not valid JSON: ", e.what())), "");
  }
  const engine::Tokenizer* tok = engine_->tokenizer();
  if (tok == nullptr) {
    return Fail(exchange, absl::FailedPreconditionError("the model has no tokenizer"), "");
  }
  if (!body.is_object()) {
    return Fail(exchange, absl::InvalidArgumentError("body: must be a JSON object"), "");
  }
  std::string text;
  bool add_special = true;
  if (auto it = body.find("add_special_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return Fail(exchange, absl::InvalidArgumentError("add_special_tokens: must be a boolean"),
                  "");
    }
    add_special = it->get<bool>();
  }
  if (auto messages = body.find("messages"); messages != body.end()) {
    if (model_.chat_template == nullptr) {
      return Fail(exchange,
                  absl::FailedPreconditionError("messages: the model has no chat template"), "");
    }
    bool generation_prompt = true;
    if (auto g = body.find("add_generation_prompt"); g != body.end() && g->is_boolean()) {
      generation_prompt = g->get<bool>();
    }
    absl::StatusOr<std::string> rendered =
        model_.chat_template->Apply(*messages, generation_prompt);
    if (!rendered.ok()) return Fail(exchange, rendered.status(), "");
    text = *std::move(rendered);
    if (body.find("add_special_tokens") == body.end()) add_special = false;
  } else {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || !prompt->is_string()) {
      return Fail(exchange, absl::InvalidArgumentError("prompt: must be a string"), "");
    }
    text = prompt->get<std::string>();
  }
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text, add_special);
  if (!ids.ok()) {
    return Fail(exchange,
                absl::Status(ids.status().code(), absl::StrCat("prompt: ", ids.status().message())),
                "");
  }
  const json out = {
      {"tokens", *ids}, {"count", ids->size()}, {"max_model_len", engine_->config().max_seq_len}};
  exchange.Reply(200, "application/json", Dump(out));
}

void OpenAiService::Detokenize(HttpRequest& request, HttpExchange& exchange) {
  json body;
  try {
    body = json::parse(request.body);
  } catch (const json::exception& e) {
    return Fail(exchange,
                absl::InvalidArgumentError(absl::StrCat("body: not valid JSON: ", e.what())), "");
  }
  const engine::Tokenizer* tok = engine_->tokenizer();
  if (tok == nullptr) {
    return Fail(exchange, absl::FailedPreconditionError("the model has no tokenizer"), "");
  }
  auto tokens = body.is_object() ? body.find("tokens") : body.end();
  if (!body.is_object() || tokens == body.end() || !tokens->is_array()) {
    return Fail(exchange, absl::InvalidArgumentError("tokens: must be an array of token ids"), "");
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= engine_->config().vocab_size) {
      return Fail(exchange,
                  absl::InvalidArgumentError(absl::StrCat("tokens[", i, "]: not a token id in [0, ",
                                                          engine_->config().vocab_size, ")")),
                  "");
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  absl::StatusOr<std::string> text = tok->Decode(ids, /*skip_special_tokens=*/false);
  if (!text.ok()) return Fail(exchange, text.status(), "");
  exchange.Reply(200, "application/json", Dump(json{{"prompt", *text}}));
}

void OpenAiService::TokenizerInfo(HttpExchange& exchange) {
  const engine::Tokenizer* tok = engine_->tokenizer();
  if (tok == nullptr) {
    return Fail(exchange, absl::FailedPreconditionError("the model has no tokenizer"), "");
  }
  auto special = [&](std::optional<int32_t> id) -> json {
    if (!id) return nullptr;
    absl::StatusOr<std::string> text = tok->Decode({*id}, /*skip_special_tokens=*/false);
    return text.ok() ? json(*text) : json(nullptr);
  };
  const engine::ModelConfig& c = engine_->config();
  std::optional<int32_t> eos = tok->eos_id();
  if (!c.eos_token_ids.empty()) eos = c.eos_token_ids.front();
  std::optional<int32_t> bos = tok->bos_id();
  if (c.bos_token_id) bos = *c.bos_token_id;
  json out = {
      {"tokenizer_class", "modserve"},
      {"model_max_length", c.max_seq_len},
      {"vocab_size", tok->vocab_size()},
      {"bos_token", special(bos)},
      {"eos_token", special(eos)},
      {"pad_token", nullptr},
      {"chat_template", tok->chat_template().empty() ? json(nullptr) : json(tok->chat_template())}};
  exchange.Reply(200, "application/json", Dump(out));
}

void OpenAiService::Models(const HttpRequest& request, HttpExchange& exchange) {
  const json model = {{"id", model_.name},
                      {"object", "model"},
                      {"created", created_},
                      {"owned_by", "modserve"},
                      {"root", engine_->options().model_dir},
                      {"max_model_len", engine_->config().max_seq_len}};
  if (absl::StartsWith(request.path, "/v1/models/")) {
    const std::string name = request.path.substr(std::string("/v1/models/").size());
    if (name != model_.name) {
      return Fail(exchange,
                  absl::NotFoundError(absl::StrCat("model: '", name, "' is not served here")), "");
    }
    return exchange.Reply(200, "application/json", Dump(model));
  }
  exchange.Reply(200, "application/json",
                 Dump(json{{"object", "list"}, {"data", json::array({model})}}));
}

void OpenAiService::Health(HttpExchange& exchange) {
  if (!loop_->healthy()) {
    return exchange.Reply(503, "application/json",
                          Dump(json{{"status", "unhealthy"},
                                    {"detail", "the engine failed; the server needs a restart"}}));
  }
  if (loop_->draining()) {
    return exchange.Reply(503, "application/json", Dump(json{{"status", "draining"}}));
  }
  exchange.Reply(200, "application/json", Dump(json{{"status", "ok"}}));
}

}  // namespace modserve::server
