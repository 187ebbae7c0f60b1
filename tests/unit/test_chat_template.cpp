// Chat templates rendered by minja equal Python jinja2's rendering under Hugging Face's
// apply_chat_template conventions (tests/chat/expected.json, made by tests/chat/generate_expected.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "runtime/chat.h"
#include "support/errors.h"

namespace mk {
namespace {

using test::error_of;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ChatTemplate, FamiliesRenderAsJinja2Does) {
  setenv("TZ", "UTC", 1);  // strftime_now uses local time; the expectations were made in UTC
  tzset();
  const std::string dir = std::string(MK_SOURCE_DIR) + "/tests/chat/";
  const auto spec = nlohmann::ordered_json::parse(read_file(dir + "cases.json"));
  const auto expected = nlohmann::ordered_json::parse(read_file(dir + "expected.json"));
  ChatRenderOptions o;
  o.bos_token = spec["bos_token"];
  o.eos_token = spec["eos_token"];
  o.now = spec["now"].get<std::time_t>();
  int n_text = 0, n_error = 0;
  for (const auto& [name, results] : expected["templates"].items()) {
    const std::string source = read_file(dir + "templates/" + name);
    for (const auto& c : spec["cases"]) {
      const std::string case_name = c["name"];
      o.add_generation_prompt = c["add_generation_prompt"];
      const auto& want = results.at(case_name);
      if (want.contains("text")) {
        EXPECT_EQ(render_chat_template(source, c["messages"], o), want["text"].get<std::string>())
            << name << " / " << case_name;
        ++n_text;
      } else {
        const std::string e = error_of([&] { render_chat_template(source, c["messages"], o); });
        EXPECT_NE(e.find("chat template: "), std::string::npos) << name << " / " << case_name << ": " << e;
        EXPECT_NE(e.find(want["error"].get<std::string>()), std::string::npos) << name << " / " << case_name << ": " << e;
        ++n_error;
      }
    }
  }
  EXPECT_GE(n_text, 20);
  EXPECT_GE(n_error, 3);  // raise_exception cases
}

TEST(ChatTemplate, ErrorsAreClear) {
  const nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  ChatRenderOptions o;
  EXPECT_NE(error_of([&] { render_chat_template("{% for m in messages %}", msgs, o); }).find("chat template: "),
            std::string::npos);
  EXPECT_NE(error_of([&] { render_chat_template("{{ raise_exception('no system role') }}", msgs, o); })
                .find("no system role"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { check_chat_messages(nlohmann::ordered_json::object(), "m.json"); }),
            "m.json: messages must be a JSON array of {\"role\", \"content\"} objects");
  EXPECT_EQ(error_of([&] { check_chat_messages(nlohmann::ordered_json::parse(R"([{"content": "x"}])"), "m.json"); }),
            "m.json: message 0 has no string \"role\"");
  EXPECT_EQ(error_of([&] {
              check_chat_messages(nlohmann::ordered_json::parse(R"([{"role": "user", "content": 3}])"), "m.json");
            }),
            "m.json: message 0: \"content\" must be a string, null or an array of parts");
  ModelFile m;
  m.path = "x.gguf";
  m.format = "gguf";
  EXPECT_EQ(error_of([&] { model_chat_template(m); }),
            "x.gguf: no chat template in this model (tokenizer.chat_template); pass one with --chat-template-file");
}

}  // namespace
}  // namespace mk
