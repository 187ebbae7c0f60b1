// Tool calls (OpenAI's function calling) in a chat model's reply.
//
// The tools go to the chat template as the `tools` variable (Hugging Face apply_chat_template's
// convention: the request's list of {"type": "function", "function": {name, description,
// parameters}}), and the template tells the model how to call them. What the model writes back
// depends on its family; the format is read from the template's text:
//   hermes   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of them
//            (Hermes 2 Pro, Qwen2.5, Qwen3, SmolLM3: templates that write "<tool_call>")
//   mistral  `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (templates that write "[TOOL_CALLS]")
//   granite  `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`, optionally closed by
//            `<|/tool_call|>` (Granite 3, Phi-4-mini: templates that write "<|tool_call|>")
//   json     the whole reply is one object {"name": ..., "parameters" or "arguments": {...}},
//            optionally after `<|python_tag|>` (Llama 3.1 / 3.2; templates that use `tools` otherwise)
// A template that never names `tools` cannot show the model any tool: ToolFormat::none.
//
// A call's arguments are kept as JSON text (OpenAI's `arguments` is a string). Text that does not
// parse as a call stays content: a model that writes a broken call gets its text back, not an error.
#pragma once
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "runtime/json_prefix.h"

namespace mk {

enum class ToolFormat { none, hermes, mistral, granite, json };
const char* tool_format_name(ToolFormat f);

// The format a chat template's model uses, from the template's source (see above).
ToolFormat tool_format_of(const std::string& template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct ToolReply {
  std::string content;  // the text outside the calls (trimmed)
  std::vector<ToolCall> calls;
};

// The strings that mark a call in a format's replies ("<tool_call>" / "</tool_call>", "[TOOL_CALLS]",
// "<|tool_call|>" / "<|/tool_call|>", "<|python_tag|>"); none for ToolFormat::none.
std::vector<std::string> tool_markers(ToolFormat f);

// The ids of the markers that are one control token of the vocabulary (Mistral's [TOOL_CALLS],
// Granite's <|tool_call|>, Llama 3's <|python_tag|>): decoding gives such a token no text, so a
// reply with tools renders them as their literal text (RequestParams::preserved_tokens; llama.cpp's
// server "preserved tokens") for parse_tool_reply to find.
std::vector<int32_t> tool_marker_tokens(const Tokenizer& tok, ToolFormat f);

// Splits a finished reply into text and calls.
ToolReply parse_tool_reply(ToolFormat f, const std::string& text);

// While a reply streams: how much of `text` (the reply so far) can go out as content now. Text from
// the start of a call marker on (or from where one may be beginning at the end) is held back; for
// ToolFormat::json, a reply that starts with '{' or `<|python_tag|>` (after whitespace) is held whole.
size_t tool_content_safe(ToolFormat f, const std::string& text);

// Checks an OpenAI `tools` array ([{"type": "function", "function": {"name", "description",
// "parameters", "strict"}}]); throws mk::Error naming the field ("tools[1].function.name: ...").
// Returns the function names in order.
std::vector<std::string> check_tools(const nlohmann::ordered_json& tools);

// A forced call (tool_choice "required", or one named function): the text the reply is made to begin
// with (the format's marker), and the schema of the JSON object after it: {"name": the function's
// name (or one of `names`), "arguments" (hermes, mistral) or "parameters" (json): the function's
// parameters schema, or any object when several functions are possible}. Throws mk::Error for
// parameters the JSON constraint does not support (naming the keyword).
struct ForcedCall {
  std::string prefix;
  std::shared_ptr<const JsonSchema> schema;
  std::string suffix;  // what closes the call after the object (the parser's, not generated)
};
ForcedCall forced_call(ToolFormat f, const nlohmann::ordered_json& tools, const std::string& only_name);

}  // namespace mk
