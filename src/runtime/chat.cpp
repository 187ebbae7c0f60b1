// Chat template rendering with minja (see chat.h). The one translation unit that includes minja.
#include "runtime/chat.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <minja/minja.hpp>
#include <regex>
#include <sstream>

#include "model/unicode_text.h"
#include "support/error.h"
#include "support/text_file.h"
#include "support/json.h"
#include "support/printable.h"

namespace mk {

namespace {

constexpr size_t kMaxTemplateErrorBytes = 2000;

std::string read_text(const std::filesystem::path& p) { return read_text_file(p.string()); }

// tokenizer_config.json "chat_template": a string, or a list of {"name", "template"} of which
// "default" is the one apply_chat_template uses without a name.
std::string template_from_config(const nlohmann::ordered_json& v, const std::string& source) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    for (const auto& t : v)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
    fail("{}: chat_template is a list without a \"default\" entry", source);
  }
  fail("{}: chat_template is neither a string nor a list of named templates", source);
}

}  // namespace

std::string model_chat_template(const ModelFile& model) {
  if (model.format == "gguf") {
    if (!model.has("tokenizer.chat_template"))
      fail("{}: no chat template in this model (tokenizer.chat_template); pass one with --chat-template-file",
           model.path);
    return model.get_str("tokenizer.chat_template");
  }
  if (model.format == "hf") {
    namespace fs = std::filesystem;
    const fs::path dir(model.path);
    if (fs::is_regular_file(dir / "chat_template.jinja")) return read_text(dir / "chat_template.jinja");
    const fs::path cfg = dir / "tokenizer_config.json";
    if (fs::is_regular_file(cfg)) {
      const nlohmann::ordered_json j = read_json_file(cfg.string());  // nesting-limited
      if (j.is_object() && j.contains("chat_template") && !j["chat_template"].is_null())
        return template_from_config(j["chat_template"], cfg.string());
    }
    fail("{}: no chat template (tokenizer_config.json chat_template or chat_template.jinja); pass one with "
         "--chat-template-file", model.path);
  }
  fail("{}: {} models carry no chat template; pass one with --chat-template-file", model.path, model.format);
}

nlohmann::ordered_json check_chat_messages(const nlohmann::ordered_json& messages, const std::string& source) {
  const std::string at = source.empty() ? "" : source + ": ";
  auto bad = [&](const std::string& param, const std::string& why) -> ChatMessageError {
    return ChatMessageError(param, fmt::format("{}{}: {}", at, param, why));
  };
  if (!messages.is_array())
    throw ChatMessageError("messages", at + "messages must be a JSON array of {\"role\", \"content\"} objects");
  if (messages.empty()) throw ChatMessageError("messages", at + "messages is empty");
  nlohmann::ordered_json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    auto& m = out[i];
    const std::string path = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw bad(path, "a message must be an object with \"role\" and \"content\"");
    if (!m.contains("role") || !m["role"].is_string()) throw bad(path + ".role", "missing, or not a string");
    const std::string& role = m["role"].get_ref<const std::string&>();
    if (std::find_if(std::begin(kChatRoles), std::end(kChatRoles), [&](const char* r) { return role == r; }) ==
        std::end(kChatRoles))
      throw bad(path + ".role", fmt::format("unknown role {:?} (expected system, developer, user, assistant or tool)",
                                            clip(role)));
    // OpenAI's schema lets an assistant message leave content out (a turn of tool calls): as null
    if (!m.contains("content") && role == "assistant") m["content"] = nullptr;
    if (!m.contains("content")) throw bad(path + ".content", "missing (a string, null or an array of parts)");
    auto& c = m["content"];
    if (c.is_array()) {
      std::string text;
      for (size_t j = 0; j < c.size(); ++j) {
        const auto& part = c[j];
        const std::string part_path = fmt::format("{}.content[{}]", path, j);
        if (!part.is_object()) throw bad(part_path, "a content part must be an object {\"type\": \"text\", \"text\": ...}");
        if (!part.contains("type") || !part["type"].is_string()) throw bad(part_path + ".type", "missing, or not a string");
        const std::string& type = part["type"].get_ref<const std::string&>();
        if (type != "text")
          throw bad(part_path + ".type",
                    fmt::format("content parts of type {:?} are not supported (text only)", clip(type)));
        if (!part.contains("text") || !part["text"].is_string()) throw bad(part_path + ".text", "missing, or not a string");
        if (j > 0) text += '\n';
        text += part["text"].get_ref<const std::string&>();
      }
      c = std::move(text);
    } else if (!c.is_null() && !c.is_string()) {
      throw bad(path + ".content", "must be a string, null or an array of parts");
    }
    // tool_calls (OpenAI's: [{"id", "type": "function", "function": {"name", "arguments"}}]) go to
    // the template as they are, once their shape is known to be that.
    bool has_calls = false;
    if (auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
      if (!it->is_array()) throw bad(path + ".tool_calls", "must be an array of tool calls");
      for (size_t j = 0; j < it->size(); ++j) {
        const auto& call = (*it)[j];
        const std::string call_path = fmt::format("{}.tool_calls[{}]", path, j);
        if (!call.is_object()) throw bad(call_path, "a tool call must be an object {\"type\": \"function\", \"function\": {...}}");
        auto fn = call.find("function");
        if (fn == call.end() || !fn->is_object()) throw bad(call_path + ".function", "missing, or not an object");
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string()) throw bad(call_path + ".function.name", "missing, or not a string");
        auto args = fn->find("arguments");
        if (args != fn->end() && !args->is_string() && !args->is_object())
          throw bad(call_path + ".function.arguments", "must be a string (JSON) or an object");
      }
      has_calls = !it->empty();
    }
    // No text: null for an assistant turn of tool calls (templates such as DeepSeek-R1's write the
    // calls only when `content is none`, as llama.cpp's server passes it), else "" (as llama.cpp's
    // server and the OpenAI API take it; Jinja would print "None").
    if (c.is_null() || (has_calls && c.is_string() && c.get_ref<const std::string&>().empty()))
      c = has_calls ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json("");
  }
  return out;
}

std::string render_chat_template(const std::string& source, const nlohmann::ordered_json& messages,
                                 const ChatRenderOptions& o) {
  // Text typed at the terminal (run --chat -p, chat's lines) is not checked by a JSON parser as a
  // messages file and a request body are: invalid UTF-8 is named here, at its offset in the message
  // (the tokenizer's error gave the offset in the rendered template).
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("content") || !m["content"].is_string()) continue;
    const auto& text = m["content"].get_ref<const std::string&>();
    if (const size_t at = utf8_invalid_offset(text); at < text.size())
      fail("chat message {} ({}): the text is not valid UTF-8 (byte 0x{:02x} at offset {})", i + 1,
           m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "?",
           static_cast<unsigned char>(text[at]), at);
  }
  try {
    // declared first, destroyed last: frees the reference cycles the template made (l.append(l))
    const minja::CycleCollector collector;
    // Jinja2 reads "\r\n" and "\r" as "\n" (newline_sequence), so trim_blocks and the text see one
    // newline: a template saved with Windows line ends renders as it does in Python.
    std::string normalized;
    normalized.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] != '\r') normalized += source[i];
      else if (i + 1 >= source.size() || source[i + 1] != '\n') normalized += '\n';
    }
    auto root = minja::Parser::parse(normalized, minja::Options{/*trim_blocks=*/true, /*lstrip_blocks=*/true,
                                                                /*keep_trailing_newline=*/false});
    // The OpenAI API's "developer" role is its newer name for "system": a template that does not
    // know it (it never names the role as a string, 'developer' or "developer") gets a system
    // message instead. The word in a comment or other text does not count.
    nlohmann::ordered_json msgs = messages;
    if (source.find("'developer'") == std::string::npos && source.find("\"developer\"") == std::string::npos)
      for (auto& m : msgs)
        if (m.is_object() && m.contains("role") && m["role"] == "developer") m["role"] = "system";
    auto ctx = minja::Context::make(minja::Value(nlohmann::ordered_json{
        {"messages", msgs},
        {"add_generation_prompt", o.add_generation_prompt},
        {"bos_token", o.bos_token},
        {"eos_token", o.eos_token},
    }));
    if (o.extra.is_object())
      for (const auto& [key, value] : o.extra.items()) ctx->set(key, minja::Value(value));
    const std::time_t now = o.now != 0 ? o.now : std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    ctx->set("strftime_now", minja::Value::callable([now](const std::shared_ptr<minja::Context>&,
                                                            minja::ArgumentsValue& args) -> minja::Value {
      args.expectArgs("strftime_now", {1, 1}, {0, 0});
      const std::string format = args.args[0].get<std::string>();
      std::tm local{};
      localtime_r(&now, &local);
      std::ostringstream ss;
      ss << std::put_time(&local, format.c_str());
      return ss.str();
    }));
    std::string text = root->render(ctx);
    // An empty template (or one that writes nothing for these messages) would reach the tokenizer as
    // an empty prompt, whose error blamed -p.
    if (text.empty()) fail("chat template: the conversation renders as empty text (is the template empty?)");
    // The messages are valid UTF-8 (checked above, or by a JSON parser): bytes that are not come
    // from the template itself, and the tokenizer's error would not have named it.
    if (const size_t at = utf8_invalid_offset(text); at < text.size())
      fail("chat template: the rendered text is not valid UTF-8 (byte 0x{:02x} at offset {}; the template writes it)",
           static_cast<unsigned char>(text[at]), at);
    return text;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // The location minja adds quotes the source line, which may be long: the message is bounded.
    std::string what = e.what();
    // minja indexes lists with std::vector::at, whose message names libstdc++'s internals
    static const std::regex kRange(R"(vector::_M_range_check: __n \(which is (\d+)\) >= this->size\(\) \(which is (\d+)\))");
    what = std::regex_replace(what, kRange, "list index $1 is past the end of a list of $2");
    if (what.size() > kMaxTemplateErrorBytes)
      what = what.substr(0, kMaxTemplateErrorBytes) + fmt::format("... ({} bytes)", what.size());
    // The quoted source may hold escape sequences or bytes that are not UTF-8 (a template file is
    // anyone's): escaped line by line, the lines kept (new-user trial 50).
    std::string shown;
    for (size_t at = 0; at <= what.size();) {
      const size_t nl = std::min(what.find('\n', at), what.size());
      shown += printable(std::string_view(what).substr(at, nl - at), what.size());
      if (nl < what.size()) shown += '\n';
      at = nl + 1;
    }
    fail("chat template: {}", shown);
  }
}

ChatRenderOptions chat_options_for(const ModelFile& model, const Tokenizer& tokenizer) {
  ChatRenderOptions o;
  if (tokenizer.bos_id >= 0) o.bos_token = tokenizer.token_text(tokenizer.bos_id);
  if (tokenizer.eos_id >= 0) o.eos_token = tokenizer.token_text(tokenizer.eos_id);
  // A Hugging Face directory: the strings tokenizer_config.json names, as transformers passes them
  // (a string or an AddedToken {"content": ...}); Llama 3.1 Instruct's eos_token is <|eot_id|>
  // while its first EOS id (generation_config.json) is <|end_of_text|>.
  if (model.format == "hf") {
    const std::filesystem::path cfg = std::filesystem::path(model.path) / "tokenizer_config.json";
    if (std::filesystem::is_regular_file(cfg)) {
      const nlohmann::ordered_json j = read_json_file(cfg.string());
      auto text = [&](const char* key, std::string& out) {
        if (!j.is_object() || !j.contains(key)) return;
        const auto& v = j[key];
        if (v.is_string()) out = v.get<std::string>();
        else if (v.is_object() && v.contains("content") && v["content"].is_string()) out = v["content"].get<std::string>();
      };
      text("bos_token", o.bos_token);
      text("eos_token", o.eos_token);
    }
  }
  return o;
}

std::string render_model_chat(const ModelFile& model, const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                              const std::string& template_file, const nlohmann::ordered_json& extra) {
  const std::string source = template_file.empty() ? model_chat_template(model) : read_text(template_file);
  ChatRenderOptions o = chat_options_for(model, tokenizer);
  o.extra = extra;
  return render_chat_template(source, messages, o);
}

ChatConversation::ChatConversation(Session& session, std::string template_source, std::optional<std::string> system_prompt)
    : session_(session), template_(std::move(template_source)) {
  if (!session_.tokenizer) fail("chat: the session has no tokenizer");
  // The template and the context are checked once here, with a first turn: a template that cannot
  // render one, or whose own text (and the system prompt) fills the context, would fail every turn
  // the same way, /reset included (new-user trial 48: a template with a syntax error dropped every turn).
  const auto render = [&](const nlohmann::ordered_json& head, const char* user) {
    nlohmann::ordered_json probe = head;
    probe.push_back({{"role", "user"}, {"content", user}});
    return session_.tokenizer->encode(render_chat_template(template_, probe, chat_options_for(session_.model, *session_.tokenizer)),
                                      /*add_bos=*/false, /*parse_special=*/true);
  };
  // (a template that only minds an empty message is not refused)
  const auto first_turn = [&](const nlohmann::ordered_json& head) {
    try {
      return render(head, "");
    } catch (const Error&) {
      return render(head, "Hello");
    }
  };
  std::vector<int32_t> ids;
  try {
    ids = first_turn(nlohmann::ordered_json::array());
  } catch (const Error& e) {
    fail("chat: the chat template cannot render a first turn: {}", e.what());
  }
  if (system_prompt) {
    if (const size_t at = utf8_invalid_offset(*system_prompt); at < system_prompt->size())
      fail("chat: the system prompt is not valid UTF-8 (byte 0x{:02x} at offset {})", static_cast<unsigned char>((*system_prompt)[at]), at);
    messages_.push_back({{"role", "system"}, {"content", std::move(*system_prompt)}});
    // A template that refuses a system message (Gemma's: "System role not supported").
    try {
      ids = first_turn(messages_);
    } catch (const Error& e) {
      fail("chat: the chat template cannot take a system prompt ({}); run without --system", e.what());
    }
  }
  // A context that the template's text (and the system prompt) fills would drop every turn with
  // advice (/reset, a shorter message) that cannot help: refused here, measured with an empty turn.
  if (static_cast<int64_t>(ids.size()) >= session_.n_ctx)
    fail("chat: {} takes {} tokens with the chat template (and an empty first message), but the context holds {}; {}",
         messages_.empty() ? "the template's own text" : "the system prompt", ids.size(), session_.n_ctx,
         messages_.empty() ? "use a larger -c" : "use a shorter system prompt or a larger -c");
}

void ChatConversation::reset() {
  nlohmann::ordered_json kept = nlohmann::ordered_json::array();
  if (!messages_.empty() && messages_[0]["role"] == "system") kept.push_back(messages_[0]);
  messages_ = std::move(kept);
  session_.reset();
  cached_.clear();
}

GenerateResult ChatConversation::reply(const std::string& user_text, GenerateOptions o,
                                       const std::function<void(const std::string&)>& on_text) {
  dropped_ = 0;
  const nlohmann::ordered_json before = messages_;
  messages_.push_back({{"role", "user"}, {"content", user_text}});
  GenerateResult r;
  try {  // a turn that fails anywhere (the template, the tokenizer, the step) did not happen
    auto tokens = [&] {
      const std::string rendered = render_chat_template(template_, messages_, chat_options_for(session_.model, *session_.tokenizer));
      return session_.tokenizer->encode(rendered, /*add_bos=*/false, /*parse_special=*/true);
    };
    std::vector<int32_t> ids = tokens();
    // Room for a reply: the oldest turns go (a user message and every message up to the next one),
    // never the system prompt or this turn.
    const int64_t room = std::min<int64_t>(std::max(o.n_new, 1), std::max<int64_t>(session_.n_ctx / 4, 1));
    const size_t first = !messages_.empty() && messages_[0]["role"] == "system" ? 1 : 0;
    if (static_cast<int64_t>(ids.size()) + room > session_.n_ctx && messages_.size() > first + 1) {
      // the system prompt and this turn alone first: when they do not fit, no dropping helps (and
      // each drop renders the conversation again: new-user trial 55, a 1 MB line after 250 turns)
      nlohmann::ordered_json alone = nlohmann::ordered_json::array();
      if (first) alone.push_back(messages_[0]);
      alone.push_back(messages_.back());
      const std::string r1 = render_chat_template(template_, alone, chat_options_for(session_.model, *session_.tokenizer));
      const size_t n = session_.tokenizer->encode(r1, /*add_bos=*/false, /*parse_special=*/true).size();
      if (static_cast<int64_t>(n) > session_.n_ctx)
        fail("the conversation with this turn is {} tokens, more than the context ({}); use a shorter message or a larger -c",
             ids.size(), session_.n_ctx);
    }
    while (static_cast<int64_t>(ids.size()) + room > session_.n_ctx && messages_.size() > first + 1) {
      size_t end = first + 1;
      while (end + 1 < messages_.size() && messages_[end]["role"] != "user") ++end;
      dropped_ += static_cast<int64_t>(end - first);
      messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(first), messages_.begin() + static_cast<std::ptrdiff_t>(end));
      ids = tokens();
    }
    if (static_cast<int64_t>(ids.size()) > session_.n_ctx)
      fail("the conversation with this turn is {} tokens, more than the context ({}); use a shorter message or a larger -c",
           ids.size(), session_.n_ctx);
    if (dropped_ > 0 && on_drop) on_drop(dropped_);  // before the reply streams
    const bool extends = cached_.size() < ids.size() && std::equal(cached_.begin(), cached_.end(), ids.begin()) &&
                         static_cast<int64_t>(cached_.size()) == session_.n_past;
    if (!extends) {
      session_.reset();
      cached_.clear();
    }
    o.prompt.clear();
    o.echo_prompt = false;
    o.prompt_ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(cached_.size()), ids.end());
    o.penalty_context = cached_;  // the earlier turns, already in the KV cache
    r = generate(session_, o, on_text);
  } catch (...) {
    messages_ = before;
    dropped_ = 0;
    throw;
  }
  cached_.insert(cached_.end(), r.prompt_ids.begin(), r.prompt_ids.end());
  cached_.insert(cached_.end(), r.generated_ids.begin(), r.generated_ids.end());
  cached_.resize(static_cast<size_t>(session_.n_past));  // the last sampled token may not be evaluated
  messages_.push_back({{"role", "assistant"}, {"content", r.text}});
  return r;
}

nlohmann::ordered_json read_chat_messages(const std::string& path) {
  return check_chat_messages(read_json_file(path), text_file_name(path));
}

}  // namespace mk
