// ChatTemplate: messages checked and flattened, then rendered like transformers'
// apply_chat_template (the renders are jinja2's, from tests/testdata/chat_templates/goldens.json).
#include "server/chat_template.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "engine/tokenizer/tokenizer.h"
#include "tests/common/real_model.h"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::server {
namespace {

using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::StatusIs;
using json = nlohmann::ordered_json;

const std::string kDir = std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/chat_templates/";

std::string ReadFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const json &Golden(const std::string &name) {
  static const json *goldens = new json(json::parse(ReadFile(kDir + "goldens.json")));
  for (const json &c : (*goldens)["cases"]) {
    if (c["name"] == name) return c;
  }
  ADD_FAILURE() << "no golden " << name;
  static const json *empty = new json();
  return *empty;
}

ChatTemplate Make(const std::string &model, const json &golden) {
  const json &ctx = golden["context"];
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(
      ReadFile(kDir + model + ".jinja"),
      ctx.contains("bos_token") ? std::optional<std::string>(ctx["bos_token"]) : std::nullopt,
      ctx.contains("eos_token") ? std::optional<std::string>(ctx["eos_token"]) : std::nullopt);
  EXPECT_THAT(t, IsOk());
  return *std::move(t);
}

TEST(ChatTemplateTest, RendersLikeTransformers) {
  for (const std::string model : {"smollm2", "llama3", "qwen2", "qwen2_5", "llama3_1"}) {
    for (const std::string conv : {"system_user", "multi_turn", "whitespace", "unicode"}) {
      for (const std::string gen : {"gen", "nogen"}) {
        const json &golden = Golden(model + "/" + conv + "/" + gen);
        SCOPED_TRACE(golden["name"].get<std::string>());
        ChatTemplate t = Make(model, golden);
        absl::StatusOr<std::string> text = t.Apply(golden["context"]["messages"], gen == "gen");
        ASSERT_THAT(text, IsOk());
        EXPECT_EQ(*text, golden["output"].get<std::string>());
      }
    }
  }
}

TEST(ChatTemplateTest, TextPartsJoinLikeAString) {
  const json &golden = Golden("smollm2/system_user/gen");
  ChatTemplate t = Make("smollm2", golden);
  json messages = golden["context"]["messages"];
  const std::string user = messages[1]["content"];
  const size_t cut = user.size() / 2;
  // "What is 2+2?" split into two parts joined by "\n" renders as that joined text.
  messages[1]["content"] = json::array({{{"type", "text"}, {"text", user.substr(0, cut)}},
                                        {{"type", "text"}, {"text", user.substr(cut)}}});
  absl::StatusOr<std::string> text = t.Apply(messages, true);
  ASSERT_THAT(text, IsOk());
  json joined = golden["context"]["messages"];
  joined[1]["content"] = user.substr(0, cut) + "\n" + user.substr(cut);
  EXPECT_EQ(*text, *t.Apply(joined, true));
  EXPECT_NE(text->find(user.substr(0, cut) + "\n" + user.substr(cut)), std::string::npos);
}

TEST(ChatTemplateTest, MalformedMessagesNameTheField) {
  ChatTemplate t = Make("smollm2", Golden("smollm2/user/gen"));
  EXPECT_THAT(t.Apply(json::object(), true),
              StatusIs(absl::StatusCode::kInvalidArgument, "messages: must be an array"));
  EXPECT_THAT(t.Apply(json::array(), true),
              StatusIs(absl::StatusCode::kInvalidArgument, "messages: must not be empty"));
  EXPECT_THAT(t.Apply(json::parse(R"([{"content": "x"}])"), true),
              StatusIs(absl::StatusCode::kInvalidArgument, "messages[0].role: is required"));
  EXPECT_THAT(t.Apply(json::parse(R"([{"role": "user", "content": "a"}, {"role": 3}])"), true),
              StatusIs(absl::StatusCode::kInvalidArgument, "messages[1].role"));
  EXPECT_THAT(t.Apply(json::parse(R"([{"role": "user", "content": 7}])"), true),
              StatusIs(absl::StatusCode::kInvalidArgument, "messages[0].content"));
  EXPECT_THAT(
      t.Apply(json::parse(R"([{"role": "user", "content": [{"type": "image_url",
                 "image_url": {"url": "x"}}]}])"),
              true),
      StatusIs(absl::StatusCode::kInvalidArgument, "messages[0].content[0].type: 'image_url'"));
}

TEST(ChatTemplateTest, TemplateRefusalIsTheClientsError) {
  const json &golden = Golden("llama3_1/two_tool_calls/gen");
  ChatTemplate t = Make("llama3_1", golden);
  // The template needs `tools` for this path; without them it renders the tool calls' turn and
  // still refuses two calls at once.
  EXPECT_THAT(t.Apply(golden["context"]["messages"], true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "messages: This model only supports single tool-calls at once!"));
  // SmolLM2's template concatenates content: a null content is a type error, reported as such.
  ChatTemplate smol = Make("smollm2", Golden("smollm2/user/gen"));
  EXPECT_THAT(smol.Apply(json::parse(R"([{"role": "user", "content": null}])"), true),
              StatusIs(absl::StatusCode::kInvalidArgument, "messages: the chat template failed"));
}

TEST(ChatTemplateTest, SmolLm2TemplateFromItsGgufRendersLikeTransformers) {
  MODSERVE_REQUIRE_SMOLLM2(path);
  auto tok = engine::LoadTokenizer(path);
  ASSERT_THAT(tok, IsOk());
  EXPECT_EQ((*tok)->chat_template(), ReadFile(kDir + "smollm2.jinja"));
  const json& golden = Golden("smollm2/multi_turn/gen");
  auto special = [&](std::optional<int32_t> id) -> std::optional<std::string> {
    if (!id) return std::nullopt;
    auto text = (*tok)->Decode({*id}, /*skip_special_tokens=*/false);
    return text.ok() ? std::optional<std::string>(*text) : std::nullopt;
  };
  EXPECT_EQ(special((*tok)->bos_id()), golden["context"]["bos_token"].get<std::string>());
  auto t = ChatTemplate::Create((*tok)->chat_template(), special((*tok)->bos_id()),
                                special((*tok)->eos_id()));
  ASSERT_THAT(t, IsOk());
  auto text = t->Apply(golden["context"]["messages"], true);
  ASSERT_THAT(text, IsOk());
  EXPECT_EQ(*text, golden["output"].get<std::string>());
}

TEST(ChatTemplateTest, UnparsableTemplateIsRefusedAtCreation) {
  EXPECT_THAT(ChatTemplate::Create("{% for m in messages %}", std::nullopt, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument, "chat template: template line 1"));
}

}  // namespace
}  // namespace modserve::server
