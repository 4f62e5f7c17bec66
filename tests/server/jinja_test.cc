// The Jinja interpreter against jinja2: every case of
// tests/testdata/chat_templates/goldens.json (made by make_goldens.py beside it with Python's
// jinja2, configured as transformers renders chat templates) renders to the same text, or fails
// where jinja2 fails; plus the render limits.
#include "server/jinja.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::server::jinja {
namespace {

using ::modserve::engine::testing::StatusIs;

std::string ReadFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string kDir = std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/chat_templates/";

absl::StatusOr<std::string> RenderJson(std::string_view source, const nlohmann::ordered_json &ctx) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(Value::FromJson(ctx));
}

TEST(JinjaTest, MatchesJinja2Goldens) {
  const nlohmann::ordered_json goldens =
      nlohmann::ordered_json::parse(ReadFile(kDir + "goldens.json"));
  ASSERT_GT(goldens["cases"].size(), 150u);
  int checked = 0;
  for (const auto &c : goldens["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const std::string source = c.contains("template")
                                   ? c["template"].get<std::string>()
                                   : ReadFile(kDir + c["template_file"].get<std::string>());
    absl::StatusOr<std::string> got = RenderJson(source, c["context"]);
    if (c.contains("output")) {
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, c["output"].get<std::string>());
    } else if (c["error"].is_object()) {
      ASSERT_FALSE(got.ok()) << *got;
      EXPECT_TRUE(IsRaisedByTemplate(got.status())) << got.status();
      EXPECT_EQ(got.status().message(), c["error"]["raise"].get<std::string>());
    } else {
      ASSERT_FALSE(got.ok()) << "jinja2 fails here; we rendered: " << *got;
      EXPECT_FALSE(IsRaisedByTemplate(got.status()));
      EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kInvalidArgument, ""));
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(goldens["cases"].size()));
}

TEST(JinjaTest, ErrorsNameTheLine) {
  EXPECT_THAT(RenderJson("a\nb\n{{ x.y.z }}", nlohmann::ordered_json::object()),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 3"));
  EXPECT_THAT(RenderJson("{% if %}", nlohmann::ordered_json::object()),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 1"));
  EXPECT_THAT(RenderJson("\n\n{% for x in y %}", nlohmann::ordered_json::object()),
              StatusIs(absl::StatusCode::kInvalidArgument, "endfor"));
}

TEST(JinjaTest, LimitsEndRunawayTemplates) {
  absl::StatusOr<Template> loop = Template::Parse(
      "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
      "{% endfor %}");
  ASSERT_TRUE(loop.ok());
  RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  EXPECT_THAT(loop->Render(Value::FromJson(nlohmann::ordered_json::object()), limits),
              StatusIs(absl::StatusCode::kResourceExhausted, ""));
  absl::StatusOr<Template> steps = Template::Parse(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
      "{% endfor %}");
  ASSERT_TRUE(steps.ok());
  limits.max_steps = 1000000;
  EXPECT_THAT(steps->Render(Value::FromJson(nlohmann::ordered_json::object()), limits),
              StatusIs(absl::StatusCode::kResourceExhausted, ""));
  absl::StatusOr<Template> recursion =
      Template::Parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(recursion.ok());
  EXPECT_THAT(recursion->Render(Value::FromJson(nlohmann::ordered_json::object())),
              StatusIs(absl::StatusCode::kResourceExhausted, ""));
  EXPECT_THAT(RenderJson("{{ 'x' * 100000000 }}", nlohmann::ordered_json::object()),
              StatusIs(absl::StatusCode::kResourceExhausted, ""));
}

TEST(JinjaTest, DeepNestingIsRefusedNotACrash) {
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "(";
  deep += "1";
  for (int i = 0; i < 5000; ++i) deep += ")";
  EXPECT_THAT(Template::Parse("{{ " + deep + " }}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "nested too deeply"));
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  EXPECT_THAT(Template::Parse(blocks).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "nested too deeply"));
}

TEST(JinjaTest, RefusesInvalidUtf8Source) {
  EXPECT_THAT(Template::Parse("ok \xff").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "UTF-8"));
}

}  // namespace
}  // namespace modserve::server::jinja
