// Chat templates: a conversation (OpenAI-style messages) -> the prompt text a model was trained on.
//
// Templates are Jinja2 sources shipped with the model (GGUF `tokenizer.chat_template`, or
// `chat_template` in tokenizer_config.json / chat_template.jinja of a Hugging Face directory),
// rendered with minja (third_party/minja, a Jinja2 engine) under the conventions of Hugging Face's
// `apply_chat_template`: trim_blocks and lstrip_blocks on, trailing newline dropped, variables
// `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and the functions
// `raise_exception(msg)` and `strftime_now(format)`.
#pragma once
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "model/model_file.h"
#include "model/tokenizer.h"
#include "runtime/session.h"
#include "support/error.h"

namespace mk {

struct ChatRenderOptions {
  std::string bos_token, eos_token;  // the vocabulary's BOS/EOS text ("" when it has none)
  bool add_generation_prompt = true;  // end with the header of the assistant's turn
  std::time_t now = 0;                // strftime_now's time (local time zone); 0 = the current time
  // More template variables (serve's chat_template_kwargs, e.g. Qwen3's enable_thinking), set after
  // the ones above; a JSON object (null: none).
  nlohmann::ordered_json extra;
};

// The model's own chat template. Throws mk::Error when the model has none (suggesting
// --chat-template-file) or the entry is malformed.
std::string model_chat_template(const ModelFile& model);

// A message that is not of the accepted shape: `param` names the field, e.g. "messages[2].role"
// (for the server's error object); what() starts with the source (when given) and the same path.
class ChatMessageError : public Error {
 public:
  ChatMessageError(std::string param, const std::string& message) : Error(message), param(std::move(param)) {}
  std::string param;
};

// The roles a message may have (OpenAI's chat roles; the template decides what it does with each).
inline constexpr const char* kChatRoles[] = {"system", "developer", "user", "assistant", "tool"};

// Checks `messages` and returns them as templates expect them: a JSON array of objects, each with
// a "role" from kChatRoles and a "content" that is a string, null, or an array of parts. Parts are
// OpenAI's {"type": "text", "text": ...}; their texts are joined with "\n" into one string (as
// llama.cpp and vLLM do for templates that take a string). Any other part type (image_url,
// input_audio, file, ...) is refused: this runtime reads text only. Throws ChatMessageError naming
// the first bad field (messages[i].role, messages[i].content[j].type, ...); `source` (a file name,
// or "" for none) starts the message.
nlohmann::ordered_json check_chat_messages(const nlohmann::ordered_json& messages, const std::string& source);

// Renders the template. Template syntax errors and raise_exception() calls throw mk::Error
// ("chat template: ...").
std::string render_chat_template(const std::string& source, const nlohmann::ordered_json& messages,
                                 const ChatRenderOptions& options);

// ChatRenderOptions with the BOS/EOS text: a Hugging Face directory's tokenizer_config.json
// bos_token / eos_token when it names them (as transformers), else the tokenizer's BOS/EOS ids' text.
ChatRenderOptions chat_options_for(const ModelFile& model, const Tokenizer& tokenizer);

// The prompt text for `messages` with the generation prompt: the template from `template_file`
// when not empty (as llama.cpp's --chat-template-file), else the model's own.
// `extra`: ChatRenderOptions::extra.
std::string render_model_chat(const ModelFile& model, const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                              const std::string& template_file = "", const nlohmann::ordered_json& extra = nullptr);

// A multi-turn conversation on one Session: each reply renders the whole conversation with the
// template and evaluates only the tokens past what the KV cache already holds (the cache is reset
// when the new prompt does not extend it, e.g. when a reply re-tokenizes differently).
class ChatConversation {
 public:
  // system_prompt: the system message at the start; nullopt = none (the template may write its own
  // default, as SmolLM2's does); "" = an empty one (which suppresses such a default).
  ChatConversation(Session& session, std::string template_source, std::optional<std::string> system_prompt = std::nullopt);
  // Adds the user's turn, generates the assistant's reply (streamed to on_text; it stops at
  // EOS/EOT) and adds the reply as the assistant's turn. When the conversation with this turn does
  // not leave room in the context for a reply (min(options.n_new, n_ctx / 4) tokens), its oldest
  // turns (after the system prompt: a user message and what answered it, as a whole) are dropped
  // until it does (dropped_messages() counts them); the KV cache is then computed again. Throws
  // mk::Error when the system prompt and this turn alone do not fit the context.
  GenerateResult reply(const std::string& user_text, GenerateOptions options,
                       const std::function<void(const std::string&)>& on_text = {});
  const nlohmann::ordered_json& messages() const { return messages_; }
  // Messages the latest reply() dropped to fit the context (0: none).
  int64_t dropped_messages() const { return dropped_; }
  // Called with that count when reply() drops messages, before the reply streams (chat's note).
  std::function<void(int64_t)> on_drop;
  // Starts a new conversation: every turn but the system prompt is dropped, and the KV cache with them.
  void reset();

 private:
  Session& session_;
  std::string template_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  std::vector<int32_t> cached_;  // the tokens in the KV cache, in order (size == session_.n_past)
  int64_t dropped_ = 0;
};

// Reads an OpenAI-style messages file ([{"role": .., "content": ..}, ...]): parsed with
// parse_json (nesting deeper than kMaxJsonDepth refused), checked and normalized by
// check_chat_messages. Throws mk::Error naming the file.
nlohmann::ordered_json read_chat_messages(const std::string& path);

}  // namespace mk
