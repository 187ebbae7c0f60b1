// Tool calls in chat replies (runtime/tool_calls.h): the format a template's model writes, replies
// split into text and calls, what a stream may send before a call, `tools` checks, and a forced
// call's constraint. Suite JsonToolCalls* runs in the ASan group (Json*).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/json_prefix.h"
#include "runtime/tool_calls.h"
#include "support/error.h"

namespace mk {
namespace {

using ojson = nlohmann::ordered_json;

TEST(JsonToolCalls, FormatComesFromTheTemplate) {
  EXPECT_EQ(tool_format_of("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolFormat::none);
  EXPECT_EQ(tool_format_of("{% if tools %}{{ tools | tojson }} reply <tool_call>{...}</tool_call>{% endif %}"), ToolFormat::hermes);
  EXPECT_EQ(tool_format_of("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}[TOOL_CALLS]"), ToolFormat::mistral);
  EXPECT_EQ(tool_format_of("{%- if tools is not none %}<|python_tag|>{{ tools }}{% endif %}"), ToolFormat::json);
  EXPECT_EQ(tool_format_of("{%- if tools %}<|start_of_role|>available_tools<|end_of_role|>{{ tools | tojson }}{% endif %}"
                           "{{ '<|tool_call|>' + message.tool_calls | tojson }}"),
            ToolFormat::granite);
  EXPECT_EQ(tool_markers(ToolFormat::granite), (std::vector<std::string>{"<|tool_call|>", "<|/tool_call|>"}));
  EXPECT_EQ(tool_markers(ToolFormat::none), (std::vector<std::string>{}));
  // "<tool_call>" without tools: the template cannot show any tool
  EXPECT_EQ(tool_format_of("<tool_call>"), ToolFormat::none);
}

TEST(JsonToolCalls, HermesRepliesSplitIntoTextAndCalls) {
  ToolReply r = parse_tool_reply(ToolFormat::hermes,
                                 "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                                 "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me look.");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, R"({"tz":"CET"})");  // arguments given as JSON text
  // An unclosed last call (the reply ended at EOS before the closing tag) still counts.
  r = parse_tool_reply(ToolFormat::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.content, "");
  // No arguments member: an empty object; "parameters" is read as arguments.
  r = parse_tool_reply(ToolFormat::hermes, "<tool_call>{\"name\": \"f\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  r = parse_tool_reply(ToolFormat::hermes, "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"a":1})");
  // Broken calls stay text: not JSON, no name, arguments that are not an object.
  for (const char* text : {"<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                           "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                           "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}</tool_call>", "<tool_call>{\"name\": \"\"}</tool_call>",
                           "<tool_call>[]</tool_call>"}) {
    r = parse_tool_reply(ToolFormat::hermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // A good call followed by a broken one: the first is a call, the rest text.
  r = parse_tool_reply(ToolFormat::hermes, "<tool_call>{\"name\": \"f\"}</tool_call> then <tool_call>oops");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "then <tool_call>oops");
  // An argument holding the closing tag (new-user trial 47), and text after the call.
  r = parse_tool_reply(ToolFormat::hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"</tool_call>{]\\\"\"}}\n</tool_call> done");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"x":"</tool_call>{]\""})");
  EXPECT_EQ(r.content, "done");
  r = parse_tool_reply(ToolFormat::hermes, "<tool_call>{\"name\": \"f\"} trailing</tool_call>");  // not the closing tag
  EXPECT_TRUE(r.calls.empty());
  r = parse_tool_reply(ToolFormat::hermes, "  plain answer \n");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "plain answer");
}

TEST(JsonToolCalls, MistralAndJsonReplies) {
  ToolReply r = parse_tool_reply(ToolFormat::mistral,
                                 "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}, \"id\": \"abc123def\"}]");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.content, "");
  r = parse_tool_reply(ToolFormat::mistral, "[TOOL_CALLS] {\"name\": \"a\", \"arguments\": {}}");  // one object
  ASSERT_EQ(r.calls.size(), 1u);
  r = parse_tool_reply(ToolFormat::mistral, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"s\": \"]}\"}}] and more");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"s":"]}"})");
  EXPECT_EQ(r.content, "and more");
  r = parse_tool_reply(ToolFormat::mistral, "[TOOL_CALLS][{\"name\": \"a\"}, 5]");  // one bad element: all text
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "[TOOL_CALLS][{\"name\": \"a\"}, 5]");

  // Granite: the same array after <|tool_call|>; Phi-4-mini closes it with <|/tool_call|>
  r = parse_tool_reply(ToolFormat::granite, "<|tool_call|>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}]");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(r.content, "");
  r = parse_tool_reply(ToolFormat::granite, "Sure. <|tool_call|>[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {}}]\n<|/tool_call|> done");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.content, "Sure.  done");
  r = parse_tool_reply(ToolFormat::granite, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]");  // another format's marker
  EXPECT_TRUE(r.calls.empty());

  r = parse_tool_reply(ToolFormat::json, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Oslo"})");
  r = parse_tool_reply(ToolFormat::json, "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"q":"x"})");
  r = parse_tool_reply(ToolFormat::json, "{\"answer\": 42}");  // JSON, but not a call
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "{\"answer\": 42}");
  r = parse_tool_reply(ToolFormat::json, "Sure: {\"name\": \"f\"}");  // a call must be the whole reply
  EXPECT_TRUE(r.calls.empty());
}

TEST(JsonToolCalls, StreamsHoldBackWhatMayBeACall) {
  const std::string hermes = "Checking the weather <tool_call>{\"name\"";
  EXPECT_EQ(tool_content_safe(ToolFormat::hermes, hermes), hermes.find('<'));
  EXPECT_EQ(tool_content_safe(ToolFormat::hermes, "Checking <tool_"), 9u);  // a marker may be beginning
  EXPECT_EQ(tool_content_safe(ToolFormat::hermes, "a < b"), 5u);
  EXPECT_EQ(tool_content_safe(ToolFormat::hermes, "a <"), 2u);
  EXPECT_EQ(tool_content_safe(ToolFormat::mistral, "[TOOL_"), 0u);
  EXPECT_EQ(tool_content_safe(ToolFormat::mistral, "ok [1]"), 6u);
  EXPECT_EQ(tool_content_safe(ToolFormat::granite, "ok <|tool"), 3u);
  EXPECT_EQ(tool_content_safe(ToolFormat::granite, "ok <|tool_call|>[{"), 3u);
  EXPECT_EQ(tool_content_safe(ToolFormat::granite, "a <| b"), 6u);
  EXPECT_EQ(tool_content_safe(ToolFormat::json, "  "), 0u);
  EXPECT_EQ(tool_content_safe(ToolFormat::json, " {\"na"), 0u);
  EXPECT_EQ(tool_content_safe(ToolFormat::json, "<|pyt"), 0u);
  EXPECT_EQ(tool_content_safe(ToolFormat::json, "<|python_tag|>{"), 0u);
  EXPECT_EQ(tool_content_safe(ToolFormat::json, "The answer is {"), 15u);
  EXPECT_EQ(tool_content_safe(ToolFormat::none, "<tool_call>"), 11u);
}

TEST(JsonToolCalls, ToolsAreCheckedByField) {
  const auto tools = [](const char* text) { return ojson::parse(text); };
  EXPECT_EQ(check_tools(tools(R"([{"type": "function", "function": {"name": "a_b-1", "description": "d", "parameters": {"type": "object"}}},
                                  {"type": "function", "function": {"name": "c"}}])")),
            (std::vector<std::string>{"a_b-1", "c"}));
  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"type": "function"})", "tools: must be an array"},
      {R"([5])", "tools[0]: a tool must be an object"},
      {R"([{"type": "code_interpreter"}])", "tools[0].type: only \"function\""},
      {R"([{"type": "function"}])", "tools[0].function: missing"},
      {R"([{"type": "function", "function": {"description": "x"}}])", "tools[0].function.name: missing"},
      {R"([{"type": "function", "function": {"name": "has space"}}])", "tools[0].function.name: \"has space\" must be"},
      {R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])", "tools[1].function.name: \"f\" is named twice"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": "{}"}}])", "tools[0].function.parameters: must be"},
      {R"([{"type": "function", "function": {"name": "f", "description": 3}}])", "tools[0].function.description"},
      {R"([{"type": "function", "function": {"name": "f", "strict": "yes"}}])", "tools[0].function.strict"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])", "tools[0].function.parameters: must describe an object"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": {"enum": ["a"]}}}])", "tools[0].function.parameters: must describe an object"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/S", "$defs": {"S": {"type": "string"}}}}}])",
       "tools[0].function.parameters: must describe an object"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/Gone"}}}])", "names nothing"},
  };
  for (const auto& [text, want] : bad) {
    try {
      check_tools(tools(text));
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(JsonToolCalls, ForcedCallsAreConstrainedToTheFunction) {
  const ojson tools = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "now"}}])");
  const ForcedCall one = forced_call(ToolFormat::hermes, tools, "get_weather");
  EXPECT_EQ(one.prefix, "<tool_call>\n");
  EXPECT_EQ(one.suffix, "\n</tool_call>");
  auto fits = [](const ForcedCall& fc, const std::string& text) {
    JsonPrefix p(*fc.schema);
    return p.feed(text) && p.complete();
  };
  EXPECT_TRUE(fits(one, R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})"));
  EXPECT_FALSE(fits(one, R"({"name": "now", "arguments": {}})"));
  EXPECT_FALSE(fits(one, R"({"name": "get_weather", "arguments": {"city": "Paris"}})"));  // unit required
  EXPECT_FALSE(fits(one, R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "k"}})"));
  // The parsed reply of a forced call: prefix + object + suffix.
  const ToolReply r = parse_tool_reply(ToolFormat::hermes, one.prefix + R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})" + one.suffix);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
  // "required" with two functions: a union tagged by the name, each call's arguments of its function.
  const ForcedCall any = forced_call(ToolFormat::mistral, tools, "");
  EXPECT_EQ(any.prefix, "[TOOL_CALLS][");
  const ForcedCall granite = forced_call(ToolFormat::granite, tools, "now");
  EXPECT_EQ(granite.prefix, "<|tool_call|>[");
  EXPECT_EQ(granite.suffix, "]");
  ASSERT_EQ(parse_tool_reply(ToolFormat::granite, granite.prefix + R"({"name": "now", "arguments": {}})" + granite.suffix).calls.size(), 1u);
  EXPECT_TRUE(fits(any, R"({"name": "now", "arguments": {}})"));  // no parameters: an empty argument list
  EXPECT_FALSE(fits(any, R"({"name": "now", "arguments": {"x": [1]}})"));
  EXPECT_TRUE(fits(any, R"({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "f"}})"));
  EXPECT_FALSE(fits(any, R"({"name": "get_weather", "arguments": {}})"));
  EXPECT_FALSE(fits(any, R"({"name": "get_weather", "arguments": {"x": [1]}})"));
  EXPECT_FALSE(fits(any, R"({"name": "later", "arguments": {}})"));
  // Parameters with $defs (as pydantic writes them): their "#/$defs/..." refer inside the parameters.
  const ojson defs = ojson::parse(R"([
    {"type": "function", "function": {"name": "book", "parameters": {"type": "object",
      "properties": {"guest": {"$ref": "#/$defs/Guest"}}, "required": ["guest"],
      "$defs": {"Guest": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}}},
    {"type": "function", "function": {"name": "cancel", "parameters": {"type": "object",
      "properties": {"id": {"type": "integer"}, "why": {"$ref": "#/$defs/Why"}}, "required": ["id"],
      "$defs": {"Why": {"enum": ["ill", "late"]}}}}}])");
  for (const std::string& only : {std::string("book"), std::string("")}) {
    const ForcedCall d = forced_call(ToolFormat::hermes, defs, only);
    EXPECT_TRUE(fits(d, R"({"name": "book", "arguments": {"guest": {"name": "Ada"}}})")) << only;
    EXPECT_FALSE(fits(d, R"({"name": "book", "arguments": {"guest": {}}})")) << only;
    EXPECT_EQ(fits(d, R"({"name": "cancel", "arguments": {"id": 3, "why": "late"}})"), only.empty());
    EXPECT_FALSE(fits(d, R"({"name": "cancel", "arguments": {"id": 3, "why": "bored"}})"));
  }
  // Llama 3's json format names the arguments "parameters" and has no marker.
  const ForcedCall js = forced_call(ToolFormat::json, tools, "now");
  EXPECT_EQ(js.prefix, "");
  EXPECT_TRUE(fits(js, R"({"name": "now", "parameters": {}})"));
  EXPECT_FALSE(fits(js, R"({"name": "now", "arguments": {}})"));
  // A recursive pydantic model as parameters: {"$defs": ..., "$ref": "#/$defs/Node"} (trial 47).
  const ojson rec = ojson::parse(R"([{"type": "function", "function": {"name": "walk", "parameters": {
    "$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
              "required": ["v", "next"]}}, "$ref": "#/$defs/Node"}}}])");
  EXPECT_EQ(check_tools(rec), std::vector<std::string>{"walk"});
  const ForcedCall walk = forced_call(ToolFormat::hermes, rec, "");
  EXPECT_TRUE(fits(walk, R"({"name": "walk", "arguments": {"v": 1, "next": {"v": 2, "next": null}}})"));
  EXPECT_FALSE(fits(walk, R"({"name": "walk", "arguments": {"v": 1, "next": {"v": 2}}})"));
  // A name that is not a tool, and parameters the constraint does not support: named errors.
  EXPECT_THROW(forced_call(ToolFormat::hermes, tools, "later"), Error);
  ojson many = ojson::array();
  for (int i = 0; i < 65; ++i) many.push_back({{"type", "function"}, {"function", {{"name", fmt::format("f{}", i)}}}});
  try {
    forced_call(ToolFormat::hermes, many, "");
    ADD_FAILURE() << "65 tools forced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"required\" can choose among at most 64 tools, and there are 65"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(forced_call(ToolFormat::hermes, many, "f64"));  // one named among many
  const ojson multiple = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"code": {"type": "integer", "multipleOf": 5}}}}}])");
  try {
    forced_call(ToolFormat::hermes, multiple, "f");
    ADD_FAILURE() << "multipleOf accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tools[0].function.parameters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'multipleOf' is not supported"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mk
