#include "runtime/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>

#include "support/error.h"
#include "support/json.h"

namespace mk {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kMistral = "[TOOL_CALLS]", kPythonTag = "<|python_tag|>";
constexpr std::string_view kGranite = "<|tool_call|>", kGraniteClose = "<|/tool_call|>";

// The marker before a format's array of calls (mistral, granite).
std::string_view array_marker(ToolFormat f) { return f == ToolFormat::mistral ? kMistral : kGranite; }

std::string trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return std::string(s);
}

// {"name": string, key: object or JSON text of one} -> a call; nullopt otherwise.
std::optional<ToolCall> call_of(const nlohmann::ordered_json& j, std::initializer_list<const char*> arg_keys) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  ToolCall c{name->get<std::string>(), "{}"};
  for (const char* k : arg_keys) {
    auto a = j.find(k);
    if (a == j.end()) continue;
    if (a->is_object()) {
      c.arguments = a->dump();
    } else if (a->is_string()) {  // arguments already as text: kept when it is an object's
      auto parsed = nlohmann::ordered_json::parse(a->get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object()) return std::nullopt;
      c.arguments = parsed.dump();
    } else {
      return std::nullopt;
    }
    break;
  }
  return c;
}

nlohmann::ordered_json parse_or_discard(std::string_view text) {
  return nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

// The end of the JSON object or array that starts at `at` (after whitespace): the offset past its
// closing bracket, read with strings and escapes skipped (so a "</tool_call>" inside an argument
// is text), or npos when it does not close.
size_t json_value_end(std::string_view t, size_t at) {
  while (at < t.size() && (t[at] == ' ' || t[at] == '\n' || t[at] == '\t' || t[at] == '\r')) ++at;
  if (at >= t.size() || (t[at] != '{' && t[at] != '[')) return std::string_view::npos;
  int depth = 0;
  for (bool in_string = false; at < t.size(); ++at) {
    const char c = t[at];
    if (in_string) {
      if (c == '\\') ++at;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return at + 1;
    }
  }
  return std::string_view::npos;
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// A function's parameters go inside a wrapper schema: their "$ref": "#/..." pointers (pydantic
// writes "#/$defs/Model") are made to point inside it, at `base`.
void rebase_refs(nlohmann::ordered_json& j, const std::string& base) {
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) {
      if (k == "$ref" && v.is_string() && v.get_ref<const std::string&>().starts_with("#"))
        v = "#" + base + v.get_ref<const std::string&>().substr(1);
      else
        rebase_refs(v, base);
    }
  } else if (j.is_array()) {
    for (auto& v : j) rebase_refs(v, base);
  }
}

}  // namespace

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::hermes: return "hermes";
    case ToolFormat::mistral: return "mistral";
    case ToolFormat::granite: return "granite";
    case ToolFormat::json: return "json";
    default: return "none";
  }
}

ToolFormat tool_format_of(const std::string& source) {
  if (source.find("tools") == std::string::npos) return ToolFormat::none;
  if (source.find(kHermesOpen) != std::string::npos) return ToolFormat::hermes;
  if (source.find(kMistral) != std::string::npos) return ToolFormat::mistral;
  if (source.find(kGranite) != std::string::npos) return ToolFormat::granite;
  return ToolFormat::json;
}

std::vector<std::string> tool_markers(ToolFormat f) {
  switch (f) {
    case ToolFormat::hermes: return {std::string(kHermesOpen), std::string(kHermesClose)};
    case ToolFormat::mistral: return {std::string(kMistral)};
    case ToolFormat::granite: return {std::string(kGranite), std::string(kGraniteClose)};
    case ToolFormat::json: return {std::string(kPythonTag)};
    default: return {};
  }
}

std::vector<int32_t> tool_marker_tokens(const Tokenizer& tok, ToolFormat f) {
  std::vector<int32_t> ids;
  for (const std::string& m : tool_markers(f)) {
    const std::vector<int32_t> t = tok.encode(m, /*add_bos=*/false, /*parse_special=*/true);
    if (t.size() == 1 && tok.token_bytes(-1, t[0]).empty() && tok.token_text(t[0]) == m) ids.push_back(t[0]);
  }
  return ids;
}

ToolReply parse_tool_reply(ToolFormat f, const std::string& text) {
  ToolReply r;
  if (f == ToolFormat::hermes) {
    std::string content;
    size_t at = 0;
    while (at < text.size()) {
      const size_t open = text.find(kHermesOpen, at);
      if (open == std::string::npos) break;
      // The call's object ends where its brackets close (an argument may hold "</tool_call>");
      // then whitespace and the closing tag, or the end of the reply (EOS before the tag).
      const size_t body = open + kHermesOpen.size();
      const size_t end = json_value_end(text, body);
      if (end == std::string_view::npos) break;  // a broken call: it and what follows stay text
      size_t after = text.find_first_not_of(" \n\t\r", end);
      if (after != std::string::npos && text.compare(after, kHermesClose.size(), kHermesClose) != 0) break;
      auto call = call_of(parse_or_discard(std::string_view(text).substr(body, end - body)), {"arguments", "parameters"});
      if (!call) break;
      content += text.substr(at, open - at);
      r.calls.push_back(std::move(*call));
      at = after == std::string::npos ? text.size() : after + kHermesClose.size();
    }
    content += text.substr(at);
    r.content = trim(content);
    return r;
  }
  if (f == ToolFormat::mistral || f == ToolFormat::granite) {
    const std::string_view marker = array_marker(f);
    const size_t m = text.find(marker);
    if (m == std::string::npos) {
      r.content = trim(text);
      return r;
    }
    const size_t begin = m + marker.size();
    size_t end = json_value_end(text, begin);
    // the array (or one object) after the marker; text after it is content
    auto j = end == std::string_view::npos ? nlohmann::ordered_json() : parse_or_discard(std::string_view(text).substr(begin, end - begin));
    if (j.is_object()) j = nlohmann::ordered_json::array({j});
    std::vector<ToolCall> calls;
    if (j.is_array() && !j.empty())
      for (const auto& x : j) {
        auto call = call_of(x, {"arguments", "parameters"});
        if (!call) {
          calls.clear();
          break;
        }
        calls.push_back(std::move(*call));
      }
    if (calls.empty()) {
      r.content = trim(text);
      return r;
    }
    if (f == ToolFormat::granite) {  // Phi-4-mini closes the array with <|/tool_call|>
      const size_t after = text.find_first_not_of(" \n\t\r", end);
      if (after != std::string::npos && text.compare(after, kGraniteClose.size(), kGraniteClose) == 0)
        end = after + kGraniteClose.size();
    }
    r.content = trim(text.substr(0, m) + text.substr(end));
    r.calls = std::move(calls);
    return r;
  }
  if (f == ToolFormat::json) {
    const std::string lead = trim(text);
    std::string_view t = lead;
    if (t.starts_with(kPythonTag)) t.remove_prefix(kPythonTag.size());
    if (auto call = call_of(parse_or_discard(t), {"parameters", "arguments"})) {
      r.calls.push_back(std::move(*call));
      return r;
    }
  }
  r.content = trim(text);
  return r;
}

size_t tool_content_safe(ToolFormat f, const std::string& text) {
  switch (f) {
    case ToolFormat::hermes:
    case ToolFormat::mistral:
    case ToolFormat::granite: {
      const std::string_view marker = f == ToolFormat::hermes ? kHermesOpen : array_marker(f);
      if (const size_t at = text.find(marker); at != std::string::npos) return at;
      return text.size() - partial_marker(text, marker);
    }
    case ToolFormat::json: {
      const size_t first = text.find_first_not_of(" \n\t\r");
      if (first == std::string::npos) return 0;  // only whitespace so far: a call may follow
      const std::string_view rest = std::string_view(text).substr(first);
      if (rest[0] == '{') return 0;
      if (rest.size() < kPythonTag.size() ? kPythonTag.starts_with(rest) : rest.starts_with(kPythonTag)) return 0;
      return text.size();
    }
    default:
      return text.size();
  }
}

std::vector<std::string> check_tools(const nlohmann::ordered_json& tools) {
  if (!tools.is_array()) fail("tools: must be an array of {{\"type\": \"function\", \"function\": {{...}}}}");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) fail("{}: a tool must be an object {{\"type\": \"function\", \"function\": {{...}}}}", at);
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function")
      fail("{}.type: only \"function\" tools are supported", at);
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) fail("{}.function: missing, or not an object", at);
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) fail("{}.function.name: missing, or not a string", at);
    const std::string& n = name->get_ref<const std::string&>();
    // OpenAI's rule: a-z, A-Z, 0-9, underscores and dashes, at most 64.
    if (n.empty() || n.size() > 64 ||
        !std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }))
      fail("{}.function.name: {:?} must be 1 to 64 letters, digits, underscores or dashes", at, clip(n));
    if (std::find(names.begin(), names.end(), n) != names.end()) fail("{}.function.name: {:?} is named twice", at, n);
    if (auto d = fn->find("description"); d != fn->end() && !d->is_string() && !d->is_null())
      fail("{}.function.description: must be a string", at);
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
      // The arguments are an object (OpenAI's rule): a schema of another type could only be
      // written as a call the parser then refuses.
      if (!p->is_object()) fail("{}.function.parameters: must be a JSON Schema object", at);
      // pydantic writes a recursive model as {"$defs": {...}, "$ref": "#/$defs/Model"}: its target is read
      const nlohmann::ordered_json* top = &*p;
      if (auto ref = p->find("$ref"); ref != p->end() && ref->is_string() && !p->contains("type")) {
        const std::string& r = ref->get_ref<const std::string&>();
        try {
          if (r.starts_with("#")) top = &p->at(nlohmann::ordered_json::json_pointer(r.substr(1)));
        } catch (const nlohmann::ordered_json::exception&) {
          fail("{}.function.parameters: '$ref' {:?} names nothing in the parameters", at, clip(r));
        }
      }
      auto type = top->find("type");
      if (!p->empty() && top->is_object() && (type == top->end() ? !top->contains("properties") : *type != "object"))
        fail("{}.function.parameters: must describe an object (\"type\": \"object\"), got {}", at, clip(p->dump(), 80));
    }
    if (auto s = fn->find("strict"); s != fn->end() && !s->is_boolean() && !s->is_null())
      fail("{}.function.strict: must be a boolean", at);
    names.push_back(n);
  }
  return names;
}

ForcedCall forced_call(ToolFormat f, const nlohmann::ordered_json& tools, const std::string& only_name) {
  ForcedCall fc;
  if (f == ToolFormat::hermes) {
    fc.prefix = "<tool_call>\n";
    fc.suffix = "\n</tool_call>";
  } else if (f == ToolFormat::mistral || f == ToolFormat::granite) {
    fc.prefix = std::string(array_marker(f)) + "[";
    fc.suffix = "]";
  }
  const char* args_key = f == ToolFormat::json ? "parameters" : "arguments";
  // One object per possible function: {"name": its name, args_key: its parameters}; several are a
  // union tagged by the name (JsonSchemaNode::tagged), so each call's arguments fit its function.
  nlohmann::ordered_json branches = nlohmann::ordered_json::array();
  std::vector<size_t> tool_of;  // branch -> index in tools
  size_t n_branches = 0;
  for (const auto& t : tools) n_branches += only_name.empty() || t["function"]["name"] == only_name;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& fn = tools[i]["function"];
    const std::string n = fn["name"].get<std::string>();
    if (!only_name.empty() && n != only_name) continue;
    // No parameters (or {}): an empty argument list, as OpenAI reads it.
    nlohmann::ordered_json args = {{"type", "object"}, {"additionalProperties", false}};
    if (auto p = fn.find("parameters"); p != fn.end() && p->is_object() && !p->empty()) args = *p;
    rebase_refs(args, n_branches == 1 ? fmt::format("/properties/{}", args_key)
                                      : fmt::format("/anyOf/{}/properties/{}", branches.size(), args_key));
    branches.push_back({{"type", "object"},
                        {"properties", {{"name", {{"const", n}}}, {args_key, std::move(args)}}},
                        {"required", {"name", args_key}}});
    tool_of.push_back(i);
  }
  if (branches.empty()) fail("tool_choice: no tool named {:?}", only_name);
  if (branches.size() > JsonSchema::kMaxChoices)
    fail("tool_choice: \"required\" can choose among at most {} tools, and there are {}; name one "
         "({{\"type\": \"function\", \"function\": {{\"name\": ...}}}}) or send fewer",
         JsonSchema::kMaxChoices, branches.size());
  const nlohmann::ordered_json schema = branches.size() == 1 ? branches[0] : nlohmann::ordered_json{{"anyOf", branches}};
  try {
    fc.schema = JsonSchema::compile(schema);
  } catch (const Error& e) {
    // The compiler names a pointer inside this wrapper: say which tool's parameters it is in.
    std::string msg = e.what();
    for (size_t k = 0; k < branches.size(); ++k) {
      const std::string inner = branches.size() == 1 ? fmt::format("json_schema /properties/{}", args_key)
                                                     : fmt::format("json_schema /anyOf/{}/properties/{}", k, args_key);
      if (const size_t at = msg.find(inner); at != std::string::npos) {
        msg.replace(at, inner.size(), fmt::format("tools[{}].function.parameters", tool_of[k]));
        break;
      }
    }
    fail("{}", msg);
  }
  return fc;
}

}  // namespace mk
