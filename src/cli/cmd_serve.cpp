// `megakernel serve`: an OpenAI-compatible HTTP server (cpp-httplib) over the continuous-batching
// engine (runtime/engine.h). Endpoints: GET /health, GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions (stream: Server-Sent Events), GET /metrics (Prometheus text); with
// --embeddings POST /v1/embeddings instead of the completions (runtime/embed.h).
// Errors are OpenAI error objects: {"error": {"message", "type", "param", "code"}}.
#include <httplib.h>
#include <boost/archive/iterators/base64_from_binary.hpp>
#include <boost/archive/iterators/transform_width.hpp>
#include <pthread.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>
#include <thread>
#include <utility>

#include "cli/commands.h"
#include "cli/http_connections.h"
#include "runtime/chat.h"
#include "model/tokenizer.h"
#include "runtime/embed.h"
#include "runtime/engine.h"
#include "runtime/reasoning.h"
#include "runtime/session.h"
#include "runtime/tool_calls.h"
#include "support/env.h"
#include "support/error.h"
#include "support/json.h"
#include "support/text_file.h"

namespace mk::cli {

namespace {
using json = nlohmann::ordered_json;

struct ServeOptions {
  SessionOptions session;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int max_queue = 32;
  int64_t kv_tokens = 0;
  std::string api_key;
  double timeout_s = 600;
  size_t max_body = 1 << 20;
  std::string template_file;
  std::string model_id;
  bool prefix_cache = true;
  bool embeddings = false;  // serve POST /v1/embeddings instead of completions (an embedding graph)
  std::string reasoning_format = "deepseek";
  int draft = 0;  // prompt lookup decoding (RequestParams::draft)  // deepseek: <think> blocks go to reasoning_content; none: left in content
  std::string pooling;      // runtime/embed.h: mean, cls or last; "" = the model's
};

// --timeout above a year would overflow the deadline arithmetic for no use (0 means no limit);
// --max-body is at least 1 byte (0 would refuse every body) and at most 1 TiB.
constexpr double kMaxTimeoutS = 365.0 * 24 * 3600;
constexpr int64_t kMaxBodyLimit = int64_t{1} << 40;
constexpr int kMaxMembers = 4096;  // of one JSON object in a request body

// A request the client got wrong (or cannot be served now): status, OpenAI error type and field.
struct HttpError {
  int status;
  std::string message, type = "invalid_request_error", param;
  std::string code;
};

json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

// Every JSON the server writes: bytes that are not UTF-8 (a token piece cut inside a character, a
// message echoing request bytes) become U+FFFD instead of making dump() throw mid-reply; the text
// is always valid JSON.
std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(json_text(error_json(e.message, e.type, e.param, e.code)), "application/json");
}

// Offset of the first byte of `s` that does not start or continue a valid UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF are invalid, as in RFC 3629), or npos.
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned b = p[i + k];
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw HttpError{400, message, "invalid_request_error", param, ""};
}

// Bytes as base64 (RFC 4648, padded): an embedding's float32 values, little-endian, for
// encoding_format "base64" (what the openai client asks for by default).
std::string base64(const void* data, size_t n) {
  using namespace boost::archive::iterators;
  using It = base64_from_binary<transform_width<const char*, 6, 8>>;
  const char* p = static_cast<const char*>(data);
  std::string s(It(p), It(p + n));
  s.append((3 - n % 3) % 3, '=');
  return s;
}

// Non-streaming replies still running after heartbeat_after are sent chunked, with a whitespace
// heartbeat every heartbeat_every (a write to a closed connection fails by the second one). Tests
// shorten both with MK_SERVE_HEARTBEAT_AFTER_MS / MK_SERVE_HEARTBEAT_EVERY_MS.
std::chrono::milliseconds env_ms(const char* name, int64_t fallback) {
  return std::chrono::milliseconds(env_int(name, fallback, 0, int64_t{1} << 40));
}

// Collects `req`'s output into `out` for at most `limit`; true when the request has ended.
bool wait_until_done(Request& req, RequestOutput& out, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (auto now = std::chrono::steady_clock::now(); !out.done && now < until; now = std::chrono::steady_clock::now())
    req.wait(out, std::chrono::duration_cast<std::chrono::milliseconds>(until - now) + std::chrono::milliseconds(1));
  return out.done;
}

// Typed field access: absent or null -> the default; a wrong type -> 400 naming the field.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}
// above_lo: lo itself is out of range (the message says "above lo", not "between").
double get_number(const json& body, const char* name, double def, double lo, double hi, bool above_lo = false) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number()) bad(name, fmt::format("'{}' must be a number", name));
  double x = v->get<double>();
  if (!(x >= lo && x <= hi) || (above_lo && x == lo))
    bad(name, above_lo ? fmt::format("'{}' must be above {} and at most {}, got {}", name, lo, hi, x)
                       : fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, x));
  return x;
}
int64_t get_int(const json& body, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return def;
  int64_t x = 0;
  if (v->is_number_float()) {  // 4.0 as JSON clients often write a whole number: accepted; 4.5 is not
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) bad(name, fmt::format("'{}' must be an integer", name));
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) bad(name, fmt::format("'{}' is too large", name));
    x = static_cast<int64_t>(d);
  } else {
    if (!v->is_number_integer()) bad(name, fmt::format("'{}' must be an integer", name));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(name, fmt::format("'{}' is too large", name));
    x = v->get<int64_t>();
  }
  if (x < lo || x > hi)
    bad(name, lo == hi ? fmt::format("only '{}' = {} is supported, got {}", name, lo, x)
                       : fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, x));
  return x;
}
// The token of an "Authorization: Bearer TOKEN" header; the scheme is case-insensitive (RFC 7235
// section 2.1), "" when the header is absent or of another scheme.
std::string bearer_token(const std::string& header) {
  const size_t sp = header.find(' ');
  if (sp != 6) return "";
  for (size_t i = 0; i < 6; ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != "bearer"[i]) return "";
  const size_t t = header.find_first_not_of(' ', sp);
  return t == std::string::npos ? "" : header.substr(t);
}
bool get_bool(const json& body, const char* name, bool def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean", name));
  return v->get<bool>();
}

// One prompt of a request (completions may send several).
struct PromptIn {
  std::vector<int32_t> ids;
  std::string echo_text;  // with echo: its text as the reply shows it
};

struct ParsedRequest {
  RequestParams params;  // each choice's, but for prompt_ids (its prompt's) and its seed
  std::vector<PromptIn> prompts;
  int n = 1;                 // choices per prompt: choice index = prompt index * n + j
  bool random_seed = false;  // no seed given: each choice draws its own
  bool stream = false, include_usage = false, return_token_ids = false;
  bool tokens_as_ids = false;  // logprobs name tokens "token_id:N" (vLLM's return_tokens_as_token_ids)
  bool echo = false;           // completions: the reply's text (and logprobs) begin with the prompt's
  // Chat with tools: the reply's tool calls are read in this format (none: plain text). A forced
  // call (tool_choice "required" or a named function) begins the reply with forced_prefix (put at
  // the end of the prompt) and its JSON object is constrained; forced_suffix closes it for the parser.
  ToolFormat tools = ToolFormat::none;
  std::string forced_prefix, forced_suffix;
  bool one_call = false;  // parallel_tool_calls false: calls past the first are dropped
  // Chat with a template that thinks (runtime/reasoning.h): the reply's <think> block goes to
  // reasoning_content; reasoning_open: the prompt left it open (the reply starts inside it).
  bool reasoning = false, reasoning_open = false;
  size_t n_choices() const { return prompts.size() * static_cast<size_t>(n); }
};

// Most choices per prompt (OpenAI's `n`) and most prompts in one completions request; together they
// are also bounded by the requests the server holds at once (--parallel + --max-queue).
inline constexpr int kMaxChoicesPerPrompt = 64;
inline constexpr size_t kMaxPrompts = 256;

// Why text cannot be tokenized: the model has no tokenizer, or the one it carries is damaged (named
// as `run -p` names it). For a client (`served_as` non-empty) the model file's path, which is the
// server's business, is replaced by the id the model is served as.
std::string no_tokenizer(const Session& s, const std::string& model_path = "", const std::string& served_as = "") {
  if (s.tokenizer_error.empty()) return "this model has no tokenizer";
  std::string why = s.tokenizer_error;
  if (!served_as.empty() && !model_path.empty())
    for (size_t at = why.find(model_path); at != std::string::npos; at = why.find(model_path, at + served_as.size()))
      why.replace(at, model_path.size(), served_as);
  return "the model's tokenizer cannot be used (" + why + ")";
}

class Server {
 public:
  Server(ServeOptions o, Session& s, Engine& e) : o_(std::move(o)), s_(s), e_(e) {
    try {
      const std::string source = o_.template_file.empty() ? model_chat_template(s_.model) : read_text_file(o_.template_file);
      tool_format_ = tool_format_of(source);
      if (s_.tokenizer) tool_marker_ids_ = tool_marker_tokens(*s_.tokenizer, tool_format_);
      thinks_ = template_thinks(source);
    } catch (const Error&) {
      no_chat_template_ = o_.template_file.empty();
    }
  }
  // An error's text for a client: the model file's path (the server's business) becomes the served id.
  std::string for_client(std::string msg) const {
    const std::string& path = o_.session.model_path;
    if (!path.empty())
      for (size_t at = msg.find(path); at != std::string::npos; at = msg.find(path, at + o_.model_id.size()))
        msg.replace(at, path.size(), o_.model_id);
    return msg;
  }
  const std::chrono::milliseconds heartbeat_after_ = env_ms("MK_SERVE_HEARTBEAT_AFTER_MS", 1000);
  const std::chrono::milliseconds heartbeat_every_ =
      std::max(env_ms("MK_SERVE_HEARTBEAT_EVERY_MS", 200), std::chrono::milliseconds(1));

  // A request body: a JSON object, its nesting and member counts bounded; a 400 naming the problem.
  static json parse_body(const std::string& body_text) {
    json body;
    // The top-level field being read, for naming it when its text is not UTF-8: set by its key,
    // cleared once its value (a scalar, or a container closing at depth 1) is complete.
    std::string open_field;
    std::vector<int> members;  // of each open object
    auto track = [&](int depth, json::parse_event_t event, json& parsed) {
      using E = json::parse_event_t;
      // nlohmann parses iteratively but copies, dumps and converts (for the template) recursively:
      // a body of 100000 '[' would overflow a thread's stack later. Refused while parsing.
      if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth)
        bad(open_field, fmt::format("the request body nests arrays and objects deeper than {} levels{}", kMaxJsonDepth,
                                    open_field.empty() ? "" : fmt::format(" (in '{}')", open_field)));
      if (depth == 1 && event == E::key) open_field = parsed.get<std::string>();
      else if (depth == 1 && (event == E::value || event == E::object_end || event == E::array_end)) open_field.clear();
      // ordered_json (the client's key order: a json_schema's properties) finds a key by a linear
      // search, so an object of n members costs n^2 to read: 100000 keys in a 1 MB body took 13 s
      // (new-user trial 43). Objects are bounded; a long array (logit_bias as [[id, bias], ...]) is not.
      if (event == E::object_start) members.push_back(0);
      else if (event == E::object_end && !members.empty()) members.pop_back();
      else if (event == E::key && !members.empty() && ++members.back() > kMaxMembers)
        bad(open_field, fmt::format("the request body has an object of more than {} members{}", kMaxMembers,
                                    open_field.empty() ? "" : fmt::format(" (in '{}'; logit_bias may also be a list of [id, bias] pairs)", open_field)));
      return true;
    };
    try {
      body = json::parse(body_text, track);
    } catch (const json::exception& ex) {
      const auto* pe = dynamic_cast<const json::parse_error*>(&ex);
      if (size_t off = first_invalid_utf8(body_text); off != std::string_view::npos && pe && off < pe->byte)
        bad(open_field, fmt::format("the request body is not valid UTF-8: byte 0x{:02x} at offset {}{}",
                                    static_cast<unsigned char>(body_text[off]), off,
                                    open_field.empty() ? "" : fmt::format(" (in '{}')", open_field)));
      bad("", fmt::format("the request body is not valid JSON: {}", json_error_text(ex)));
    }
    if (!body.is_object()) bad("", "the request body must be a JSON object");
    return body;
  }

  // POST /tokenize {"content", "add_special" (false: no BOS), "parse_special" (true), "with_pieces"
  // (false)} -> {"tokens": [ids]} or, with pieces, [{"id", "piece"}] (a piece that is not whole
  // UTF-8 as its bytes' list), as llama.cpp's server.
  json tokenize(const std::string& body_text) const {
    const json body = parse_body(body_text);
    const json* content = field(body, "content");
    if (!content || !content->is_string()) bad("content", "'content' must be a string");
    const bool add_special = get_bool(body, "add_special", false), parse_special = get_bool(body, "parse_special", true),
               with_pieces = get_bool(body, "with_pieces", false);
    if (!s_.tokenizer) bad("content", no_tokenizer(s_, o_.session.model_path, o_.model_id));
    const std::vector<int32_t> ids = s_.tokenizer->encode(content->get<std::string>(), add_special, parse_special);
    json tokens = json::array();
    for (const int32_t id : ids) {
      if (!with_pieces) {
        tokens.push_back(id);
        continue;
      }
      const std::string piece = s_.tokenizer->token_text(id);
      json bytes = json::array();
      for (const char c : piece) bytes.push_back(static_cast<uint8_t>(c));
      tokens.push_back({{"id", id}, {"piece", first_invalid_utf8(piece) == std::string_view::npos ? json(piece) : bytes}});
    }
    return {{"tokens", std::move(tokens)}};
  }

  // POST /detokenize {"tokens": [ids]} -> {"content": text} (control tokens as their text, bytes
  // that are not whole UTF-8 as U+FFFD).
  json detokenize(const std::string& body_text) const {
    const json body = parse_body(body_text);
    const json* tokens = field(body, "tokens");
    if (!tokens || !tokens->is_array()) bad("tokens", "'tokens' must be an array of token ids");
    std::vector<int32_t> ids;
    for (const json& t : *tokens) {
      if (!t.is_number_integer()) bad("tokens", fmt::format("'tokens' must be an array of token ids (integers), not {}", clip_json(t)));
      if ((t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= s_.hparams.n_vocab)
        bad("tokens", fmt::format("token {} is not an id of the vocabulary [0, {})", clip_json(t), s_.hparams.n_vocab));
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    if (!s_.tokenizer) bad("tokens", no_tokenizer(s_, o_.session.model_path, o_.model_id));
    // Control tokens as their text (<|im_end|>), as llama.cpp's; ids past the tokenizer's own
    // (padded embedding rows) as nothing.
    Utf8Stream stream;
    std::string text;
    int32_t prev = -1;
    const int32_t mid = s_.tokenizer->n_vocab();  // a `prev` that is neither the start nor BOS
    for (const int32_t id : ids) {
      if (id >= s_.tokenizer->n_vocab()) continue;
      std::string b = s_.tokenizer->token_bytes(prev, id);
      // a control token (no bytes anywhere) as its text; a SentencePiece piece that is only the
      // dummy prefix's space gives nothing at the start, as it would in decode()
      if (b.empty() && s_.tokenizer->token_bytes(mid, id).empty()) b = s_.tokenizer->token_text(id);
      text += stream.push(b);
      prev = id;
    }
    return {{"content", text + stream.flush()}};
  }

  ParsedRequest parse(const std::string& body_text, bool chat) {
    const json body = parse_body(body_text);
    ParsedRequest r;
    if (const json* m = field(body, "model"); m && !m->is_string()) bad("model", "'model' must be a string");
    r.n = static_cast<int>(get_int(body, "n", 1, 1, kMaxChoicesPerPrompt));
    // Log-probabilities (runtime/sampler.h GeneratedLogprob): chat asks with "logprobs": true and
    // "top_logprobs": n alternatives; completions with "logprobs": n (OpenAI allows 5, here as many
    // as chat's 20). Off: absent, null or false.
    if (chat) {
      const bool on = get_bool(body, "logprobs", false);
      const int64_t top = get_int(body, "top_logprobs", 0, 0, kMaxTopLogprobs);
      if (top > 0 && !on) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      r.params.logprobs = on ? static_cast<int>(top) : -1;
    } else if (const json* lp = field(body, "logprobs"); lp && !(lp->is_boolean() && !lp->get<bool>())) {
      if (lp->is_boolean()) bad("logprobs", "'logprobs' must be an integer (the number of alternatives per token)");
      r.params.logprobs = static_cast<int>(get_int(body, "logprobs", -1, 0, kMaxTopLogprobs));
    }
    // Fields that would change the result are refused unless they hold their neutral value (clients
    // often send the defaults), rather than silently ignored.
    auto neutral = [](const json& v) {
      return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0) ||
             (v.is_string() && v.get<std::string>().empty()) || ((v.is_object() || v.is_array()) && v.empty());
    };
    if (!chat) r.echo = get_bool(body, "echo", false);
    for (const char* name : {chat ? "echo" : "tools", "suffix", "functions", "prediction", "audio",
                             // llama.cpp server's samplers (0 = off)
                             "mirostat", "dry_multiplier", "xtc_probability", "n_probs", "grammar"})
      if (const json* v = *name ? field(body, name) : nullptr; v && !neutral(*v))
        bad(name, fmt::format("'{}' is not supported", name));
    for (const char* name : {"typical_p", "tfs_z"})  // llama.cpp's, 1 = off
      if (const json* v = field(body, name); v && !(v->is_number() && v->get<double>() == 1.0))
        bad(name, fmt::format("'{}' is not supported (only 1, off)", name));
    if (const json* v = field(body, "function_call"); v && !(v->is_string() && v->get<std::string>() == "none"))
      bad("function_call", fmt::format("'function_call' {} is not supported: only \"none\" (functions are not supported)",
                                       clip_json(*v)));
    if (const json* v = field(body, "modalities");
        v && !(v->is_array() && std::all_of(v->begin(), v->end(), [](const json& m) { return m == "text"; })))
      bad("modalities", fmt::format("'modalities' {} is not supported: only [\"text\"]", clip_json(*v)));
    // llama.cpp server's top-level "json_schema": a schema as response_format's ({} any object).
    if (const json* js = field(body, "json_schema")) {
      if (field(body, "response_format")) bad("json_schema", "give 'json_schema' or 'response_format', not both");
      if (!js->is_object()) bad("json_schema", "'json_schema' must be a JSON Schema object");
      if (!s_.tokenizer)
        throw HttpError{400, no_tokenizer(s_, o_.session.model_path, o_.model_id) + ", so replies have no text to hold JSON",
                        "invalid_request_error", "json_schema", ""};
      try {
        r.params.json = js->empty() ? JsonSchema::any_object() : JsonSchema::compile(*js);
      } catch (const Error& ex) {
        bad("json_schema", ex.what());
      }
    }
    // Plain text, or one JSON object (constrained decoding: runtime/json_prefix.h).
    if (const json* v = field(body, "response_format")) {
      const json* type = v->is_object() ? field(*v, "type") : nullptr;
      const std::string t = type && type->is_string() ? type->get<std::string>() : "";
      if (v->is_object() && (t == "json_object" || t == "json_schema")) {
        if (!s_.tokenizer)
          throw HttpError{400, no_tokenizer(s_, o_.session.model_path, o_.model_id) + ", so replies have no text to hold JSON",
                          "invalid_request_error", "response_format", ""};
        if (t == "json_object" && !field(*v, "schema")) {
          r.params.json = JsonSchema::any_object();
        } else if (t == "json_object") {  // llama.cpp's server: {"type": "json_object", "schema": {...}}
          try {
            r.params.json = JsonSchema::compile(*field(*v, "schema"));
          } catch (const Error& ex) {
            bad("response_format", ex.what());
          }
        } else {  // OpenAI's {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
          const json* js = field(*v, "json_schema");
          if (!js || !js->is_object())
            bad("response_format", "'response_format' json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}");
          if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean())
            bad("response_format", "'response_format' json_schema 'strict' must be a boolean");
          const json* schema = field(*js, "schema");  // optional in OpenAI's API: then any object
          try {
            r.params.json = schema ? JsonSchema::compile(*schema) : JsonSchema::any_object();
          } catch (const Error& ex) {
            bad("response_format", ex.what());
          }
        }
      } else if (!v->is_object() || (!v->empty() && t != "text")) {
        bad("response_format",
            fmt::format("'response_format' {} is not supported: only {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} "
                        "and {{\"type\": \"json_schema\", ...}}",
                        clip_json(*v)));
      }
    }
    if (const json* v = field(body, "tool_choice"); v && !chat && !(v->is_string() && v->get<std::string>() == "none"))
      bad("tool_choice", fmt::format("'tool_choice' {} is for chat completions (with 'tools')", clip_json(*v)));
    if (const json* v = field(body, "parallel_tool_calls")) {
      if (!v->is_boolean()) bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
      r.one_call = !v->get<bool>();
    }
    get_int(body, "best_of", 1, 1, 1);  // 1.0 too, as max_tokens and n take whole numbers written as floats
    r.stream = get_bool(body, "stream", false);
    if (const json* so = field(body, "stream_options")) {
      if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
      if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
      if (const json* iu = field(*so, "include_usage")) {
        if (!iu->is_boolean()) bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
        r.include_usage = iu->get<bool>();
      }
    }
    r.return_token_ids = get_bool(body, "return_token_ids", false);
    // Without a tokenizer every token's text is "", so logprobs name tokens by id (as vLLM's
    // return_tokens_as_token_ids, which a client may also ask for): alternatives stay apart.
    r.tokens_as_ids = get_bool(body, "return_tokens_as_token_ids", false) || !s_.tokenizer;
    auto& p = r.params;
    p.sampler.temperature = static_cast<float>(get_number(body, "temperature", 1.0, 0, 2));
    const double top_p = get_number(body, "top_p", 1.0, 0, 1, /*above_lo=*/true);
    p.sampler.top_p = static_cast<float>(top_p);
    if (p.sampler.top_p <= 0) bad("top_p", fmt::format("'top_p' {} rounds to 0 as a 32-bit float", top_p));
    p.sampler.top_k = static_cast<int>(get_int(body, "top_k", 0, 0, 1 << 30));
    // min-p and the repetition penalties (runtime/sampler.h): OpenAI's presence/frequency penalties
    // and llama.cpp server's min_p, repeat_penalty and repeat_last_n (its names and defaults).
    p.sampler.min_p = static_cast<float>(get_number(body, "min_p", 0.0, 0, 1));
    p.sampler.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", 0.0, -2, 2));
    p.sampler.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", 0.0, -2, 2));
    p.sampler.repeat_penalty = static_cast<float>(get_number(body, "repeat_penalty", 1.0, 0, 1e6, /*above_lo=*/true));
    p.sampler.penalty_last_n = static_cast<int>(get_int(body, "repeat_last_n", 64, -1, INT32_MAX));
    // OpenAI's logit_bias {"<token id>": bias}, or llama.cpp's [[id, bias], ...]: bias in [-100, 100].
    if (const json* lb = field(body, "logit_bias")) {
      const int64_t n_vocab = s_.hparams.n_vocab;
      auto add = [&](const std::string& key, int64_t id, const json& bias) {
        if (id < 0 || id >= n_vocab)
          bad("logit_bias", fmt::format("'logit_bias': token {} is outside the vocabulary [0, {})", key, n_vocab));
        if (!bias.is_number() || !(bias.get<double>() >= -100 && bias.get<double>() <= 100))
          bad("logit_bias", fmt::format("'logit_bias': the bias of token {} must be a number between -100 and 100, got {}", key,
                                        clip_json(bias)));
        p.sampler.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias.get<double>()));
      };
      if (lb->is_object()) {
        for (const auto& [key, bias] : lb->items()) {
          int64_t id = -1;
          const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
          if (ec != std::errc() || end != key.data() + key.size() || key.empty() || key[0] == '+')
            bad("logit_bias", fmt::format("'logit_bias' keys must be token ids, got {}", clip_json(json(key))));
          add(key, id, bias);
        }
      } else if (lb->is_array()) {
        for (const json& pair : *lb) {
          if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer())
            bad("logit_bias", fmt::format("'logit_bias' as an array holds [token id, bias] pairs, got {}", clip_json(pair)));
          add(pair[0].dump(), pair[0].get<int64_t>(), pair[1]);
        }
      } else {
        bad("logit_bias", "'logit_bias' must be an object from token ids to biases");
      }
    }
    // No seed, or -1 (llama.cpp's "random"): a random one. Seeds above INT64_MAX (up to 2^64 - 1, as
    // `run --seed` takes) are used as they are.
    const json* sv = field(body, "seed");
    if (sv && sv->is_number_unsigned() && sv->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      p.sampler.seed = sv->get<uint64_t>();
    } else {
      const int64_t seed = sv ? get_int(body, "seed", 0, INT64_MIN, INT64_MAX) : -1;
      if (seed < -1) bad("seed", fmt::format("'seed' must be -1 (random) or between 0 and 2^64 - 1, got {}", seed));
      r.random_seed = seed == -1;
      p.sampler.seed = r.random_seed ? random_seed() : static_cast<uint64_t>(seed);
    }
    p.ignore_eos = get_bool(body, "ignore_eos", false);
    const char* max_name = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    // 0 with echo: the prompt alone, e.g. for its log-probabilities (OpenAI's legacy completions).
    p.max_tokens = get_int(body, max_name, -1, r.echo ? 0 : 1, INT64_MAX);
    if (field(body, "max_completion_tokens") && field(body, "max_tokens") &&
        get_int(body, "max_tokens", -1, r.echo ? 0 : 1, INT64_MAX) != p.max_tokens)
      bad("max_tokens", "'max_tokens' and 'max_completion_tokens' differ; give one of them");
    if (const json* st = field(body, "stop")) {
      if (st->is_string()) {
        p.stop.push_back(st->get<std::string>());
      } else if (st->is_array()) {
        if (st->size() > 16) bad("stop", "'stop' may hold at most 16 strings");
        for (const auto& x : *st) {
          if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
          p.stop.push_back(x.get<std::string>());
        }
      } else {
        bad("stop", "'stop' must be a string or an array of strings");
      }
      for (const auto& x : p.stop)
        if (x.empty()) bad("stop", "stop strings must not be empty");
      // A stop string would cut the object short and call it finished (new-user trial 43).
      if (p.json && !p.stop.empty())
        bad("stop", "'stop' cannot be combined with a JSON response_format: it would cut the object; the reply ends when the object closes");
    }
    const Tokenizer* tok = s_.tokenizer.get();
    if (!tok && !chat && !p.stop.empty())  // the reply has no text a stop string could be found in
                                            // (a chat is refused below, naming messages)
      throw HttpError{400, no_tokenizer(s_, o_.session.model_path, o_.model_id) + ", so replies have no text and "
                               "stop strings cannot match; leave 'stop' out",
                      "invalid_request_error", "stop", ""};
    if (chat) {
      const json* msgs = field(body, "messages");
      if (!msgs) bad("messages", "'messages' is required");
      if (!tok)
        throw HttpError{400, no_tokenizer(s_, o_.session.model_path, o_.model_id) + ", so it cannot chat", "invalid_request_error", "messages", ""};
      std::string prompt;
      json messages;
      try {
        messages = check_chat_messages(*msgs, "");
      } catch (const ChatMessageError& ex) {
        bad(ex.param, ex.what());
      }
      if (no_chat_template_)  // the operator's remedy (--chat-template-file) is not the client's
        throw HttpError{400,
                        fmt::format("the model '{}' has no usable chat template, so this server does not serve chat "
                                    "completions; use /v1/completions with a prompt",
                                    o_.model_id),
                        "invalid_request_error", "messages", ""};
      // Template variables the client adds (llama.cpp's server and vLLM take them the same way), e.g.
      // Qwen3's {"enable_thinking": false}; the conversation itself is not one of them.
      json kwargs = nullptr;
      if (const json* k = field(body, "chat_template_kwargs"); k && !k->is_null()) {
        if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object of template variables");
        for (const auto& [key, value] : k->items())
          if (key == "messages" || key == "add_generation_prompt" || key == "bos_token" || key == "eos_token")
            bad("chat_template_kwargs", fmt::format("'chat_template_kwargs' cannot set '{}' (it comes from the request and the model)", key));
        kwargs = *k;
      }
      parse_tools(body, r, kwargs);
      try {
        prompt = render_model_chat(s_.model, *tok, messages, o_.template_file, kwargs);
      } catch (const Error& ex) {
        bad("messages", for_client(ex.what()));
      }
      r.prompts.push_back({tok->encode(prompt + r.forced_prefix, /*add_bos=*/false, /*parse_special=*/true), ""});
      // llama.cpp's per-request reasoning_format: none leaves the <think> block in the content.
      std::string reasoning_format = o_.reasoning_format;
      if (const json* f = field(body, "reasoning_format"); f && !f->is_null()) {
        if (!f->is_string() || (*f != "none" && *f != "deepseek" && *f != "auto"))
          bad("reasoning_format", fmt::format("'reasoning_format' must be \"none\", \"deepseek\" or \"auto\", not {}", clip_json(*f)));
        reasoning_format = *f == "none" ? "none" : "deepseek";
      }
      // A forced call or a JSON reply begins at once: no reasoning to take apart.
      r.reasoning = thinks_ && reasoning_format != "none" && r.forced_prefix.empty() && !r.params.json;
      r.reasoning_open = r.reasoning && prompt_opens_thinking(prompt);
    } else {
      const json* pr = field(body, "prompt");
      if (!pr) bad("prompt", "'prompt' is required");
      // OpenAI's forms: a string, an array of token ids (one prompt), an array of strings or of
      // token-id arrays (one prompt each; lm-evaluation-harness sends [[ids], [ids], ...]).
      std::vector<const json*> list;
      if (pr->is_array() && !pr->empty() && std::any_of(pr->begin(), pr->end(), [](const json& x) { return x.is_string() || x.is_array(); })) {
        if (pr->size() > kMaxPrompts) bad("prompt", fmt::format("'prompt' holds {} prompts; at most {} per request", pr->size(), kMaxPrompts));
        for (const json& x : *pr) list.push_back(&x);
      } else {
        list.push_back(pr);
      }
      for (size_t i = 0; i < list.size(); ++i) {
        const json& x = *list[i];
        const std::string which = list.size() > 1 ? fmt::format("prompt {} of {}", i, list.size()) : "'prompt'";
        PromptIn in;
        if (x.is_string()) {
          if (!tok) bad("prompt", no_tokenizer(s_, o_.session.model_path, o_.model_id) + ": send the prompt as an array of token ids");
          in.ids = tok->encode(x.get<std::string>(), /*add_bos=*/true, /*parse_special=*/true);
        } else if (x.is_array()) {
          for (const auto& t : x) {
            if (!t.is_number_integer())
              bad("prompt", list.size() > 1 || &x != pr
                                ? fmt::format("{} must be a string or an array of token ids", which)
                                : "'prompt' must be a string, an array of token ids, or an array of prompts (strings or arrays of token ids)");
            if (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
              bad("prompt", fmt::format("prompt token id {} is outside the vocabulary [0, {})", t.get<uint64_t>(), s_.hparams.n_vocab));
            int64_t id = t.get<int64_t>();
            if (id < 0 || id >= s_.hparams.n_vocab)
              bad("prompt", fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, s_.hparams.n_vocab));
            in.ids.push_back(static_cast<int32_t>(id));
          }
        } else {
          bad("prompt", list.size() > 1 ? fmt::format("{} must be a string or an array of token ids", which)
                                        : std::string("'prompt' must be a string or an array of token ids"));
        }
        r.prompts.push_back(std::move(in));
      }
    }
    const char* prompt_name = chat ? "messages" : "prompt";
    const size_t capacity = static_cast<size_t>(std::max(e_.parallel(), 1) + o_.max_queue);
    if (r.n_choices() > capacity)
      bad(r.prompts.size() > 1 ? "prompt" : "n",
          fmt::format("this request asks for {} completions ({}), but the server holds at most {} requests at once "
                      "(--parallel {} + --max-queue {})",
                      r.n_choices(),
                      r.prompts.size() > 1 ? fmt::format("{} prompts x n {}", r.prompts.size(), r.n) : fmt::format("n = {}", r.n),
                      capacity, e_.parallel(), o_.max_queue));
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      const std::string which = r.prompts.size() > 1 ? fmt::format("prompt {} of {}", i, r.prompts.size()) : "the prompt";
      const int64_t n_prompt = static_cast<int64_t>(r.prompts[i].ids.size());
      if (n_prompt == 0) bad(prompt_name, fmt::format("{} is empty", which));
      if (n_prompt >= e_.n_ctx())
        throw HttpError{400,
                        fmt::format("this model's context is {} tokens, but {} is {} tokens; shorten the prompt",
                                    e_.n_ctx(), which, n_prompt),
                        "invalid_request_error", prompt_name, "context_length_exceeded"};
      if (p.max_tokens > e_.n_ctx() - n_prompt)
        throw HttpError{
            400,
            fmt::format("this model's context is {} tokens, but {} in {} + {} in {} do not fit; lower {}",
                        e_.n_ctx(), n_prompt, which, p.max_tokens, max_name, max_name),
            "invalid_request_error", max_name, "context_length_exceeded"};
    }
    if (o_.timeout_s > 0) p.timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
    p.draft = o_.draft;  // not for JSON replies (RequestParams::draft)
    if (r.echo && p.json) bad("echo", "'echo' cannot be combined with a JSON format: the prompt before the object would not parse");
    p.prompt_logprobs = r.echo && p.logprobs >= 0;
    if (r.echo)  // each prompt as the reply shows it: its tokens' bytes in context, whole characters
      for (PromptIn& in : r.prompts) {
        Utf8Stream utf8;
        int32_t prev = -1;
        if (tok)
          for (int32_t id : in.ids) {
            in.echo_text += utf8.push(tok->token_bytes(prev, id));
            prev = id;
          }
        in.echo_text += utf8.flush();
      }
    return r;
  }

  // OpenAI's `tools` and `tool_choice` ("none", "auto" (the default with tools), "required", or
  // {"type": "function", "function": {"name": ...}}): the tools go to the template as `tools`; the
  // reply's calls are read in the template's format (runtime/tool_calls.h); a required or named
  // call is forced (its marker ends the prompt, its object constrained to the function's schema).
  void parse_tools(const json& body, ParsedRequest& r, json& kwargs) {
    const json* tools = field(body, "tools");
    const json* choice = field(body, "tool_choice");
    std::string mode = tools && tools->is_array() && !tools->empty() ? "auto" : "none", only;
    if (choice) {
      if (choice->is_string()) {
        mode = choice->get<std::string>();
        if (mode != "none" && mode != "auto" && mode != "required")
          bad("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                         "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}", clip_json(*choice)));
      } else if (const json* fn = choice->is_object() && field(*choice, "type") && *field(*choice, "type") == "function"
                                      ? field(*choice, "function")
                                      : nullptr;
                 fn && fn->is_object() && field(*fn, "name") && field(*fn, "name")->is_string()) {
        mode = "named";
        only = field(*fn, "name")->get<std::string>();
      } else {
        bad("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                       "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}", clip_json(*choice)));
      }
    }
    if (tools) {
      try {
        check_tools(*tools);
      } catch (const Error& ex) {
        bad("tools", ex.what());
      }
    }
    if (mode == "none") return;
    if (!tools || tools->empty()) bad("tool_choice", fmt::format("'tool_choice' {} needs 'tools'", clip_json(*choice)));
    if (tool_format_ == ToolFormat::none)
      bad("tools", fmt::format("the model '{}' has a chat template that takes no tools (it never names `tools`), so it "
                               "cannot be shown them",
                               o_.model_id));
    if (kwargs.is_null()) kwargs = json::object();
    kwargs["tools"] = *tools;
    r.tools = tool_format_;
    r.params.preserved_tokens = tool_marker_ids_;
    if (mode == "auto") return;
    if (r.params.json) bad("tool_choice", "a required tool call cannot be combined with a JSON response_format");
    if (!r.params.stop.empty()) bad("stop", "'stop' cannot be combined with a required tool call: it would cut the call");
    try {
      ForcedCall fc = forced_call(tool_format_, *tools, only);
      r.forced_prefix = std::move(fc.prefix);
      r.forced_suffix = std::move(fc.suffix);
      r.params.json = std::move(fc.schema);
    } catch (const Error& ex) {
      bad(std::string_view(ex.what()).starts_with("tool_choice") ? "tool_choice" : "tools", ex.what());
    }
  }

  // The calls in `text` (a reply, or its part from where a stream began holding it back): a forced
  // call's marker before it and, once it ended, the format's closing after it; parallel_tool_calls
  // false keeps the first.
  static ToolReply read_calls(const ParsedRequest& pr, const std::string& text, FinishReason finish) {
    ToolReply tr = parse_tool_reply(pr.tools, pr.forced_prefix + text + (finish == FinishReason::stop ? pr.forced_suffix : ""));
    if (pr.one_call && tr.calls.size() > 1) tr.calls.resize(1);
    return tr;
  }

  // The assistant's message of a finished choice: its text, or with tools its content and tool
  // calls (finish_reason "tool_calls"). `index` numbers the calls' ids.
  std::pair<json, const char*> chat_message(const ParsedRequest& pr, const RequestOutput& out) {
    ReasoningParts parts{"", out.text};
    if (pr.reasoning) parts = split_reasoning(out.text, pr.reasoning_open);
    json msg = {{"role", "assistant"}, {"content", parts.content}};
    if (!parts.reasoning.empty()) msg["reasoning_content"] = parts.reasoning;
    if (pr.tools == ToolFormat::none) return {std::move(msg), finish_name(out.finish)};
    const ToolReply tr = read_calls(pr, parts.content, out.finish);
    if (tr.calls.empty()) return {std::move(msg), finish_name(out.finish)};
    msg["content"] = tr.content.empty() ? json(nullptr) : json(tr.content);
    msg["tool_calls"] = tool_calls_json(tr.calls, false, pr.tools);
    // "length" stays: a reply max_tokens cut may hold a call cut short (left as text)
    return {std::move(msg), out.finish == FinishReason::stop ? "tool_calls" : finish_name(out.finish)};
  }

  // `format`: Mistral's templates take back only ids of 9 letters and digits (they raise an
  // exception on others); other formats get OpenAI's "call_..." shape.
  static json tool_calls_json(const std::vector<ToolCall>& calls, bool indexed, ToolFormat format) {
    json a = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      json c = indexed ? json{{"index", i}} : json::object();  // a stream's delta numbers its calls
      if (format == ToolFormat::mistral) {
        static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        std::string id;
        for (uint64_t r = random_seed(); id.size() < 9; r /= 62) id += kAlnum[r % 62];
        c["id"] = id;
      } else {
        c["id"] = fmt::format("call_{:016x}", random_seed());
      }
      c["type"] = "function";
      c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
      a.push_back(std::move(c));
    }
    return a;
  }

  static uint64_t random_seed() { return (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}(); }

  // Queues every choice of the request: for prompt i, n requests whose seeds are the request's
  // seed + j (each its own random one without a seed). Choices after a prompt's first wait until it
  // has read the prompt, then start from its KV blocks (the prefix cache): one prefill per prompt.
  // All or none: when one cannot be queued, those queued are cancelled and the error thrown.
  std::vector<std::shared_ptr<Request>> submit_all(const ParsedRequest& pr, const std::shared_ptr<RequestSignal>& signal) {
    std::vector<std::shared_ptr<Request>> reqs;
    try {
      for (const PromptIn& in : pr.prompts) {
        std::shared_ptr<Request> leader;
        for (int j = 0; j < pr.n; ++j) {
          RequestParams p = pr.params;
          p.prompt_ids = in.ids;
          if (j > 0) p.sampler.seed = pr.random_seed ? random_seed() : pr.params.sampler.seed + static_cast<uint64_t>(j);
          p.signal = signal;
          if (j > 0 && e_.prefix_cache() && !p.prompt_logprobs) p.after = leader;
          reqs.push_back(submit(std::move(p)));
          if (j == 0) leader = reqs.back();
        }
      }
    } catch (...) {
      for (auto& r : reqs) r->cancel();
      throw;
    }
    return reqs;
  }

  std::shared_ptr<Request> submit(RequestParams p) {
    try {
      return e_.submit(std::move(p));
    } catch (const EngineBusy& ex) {
      if (ex.shutting_down) throw HttpError{503, ex.what(), "server_error", "", "shutting_down"};
      throw HttpError{429, ex.what(), "rate_limit_error", "", "queue_full"};
    } catch (const RequestInvalid& ex) {
      throw HttpError{400, ex.what(), "invalid_request_error", ex.param, ""};
    } catch (const Error& ex) {
      throw HttpError{400, ex.what(), "invalid_request_error", "", ""};
    }
  }

  static const char* finish_name(FinishReason r) { return r == FinishReason::length ? "length" : "stop"; }

  HttpError end_error(const RequestOutput& out) {
    switch (out.finish) {
      case FinishReason::timeout:
        return {408, fmt::format("the request did not finish within {} s (--timeout)", o_.timeout_s), "timeout_error",
                "", "timeout"};
      case FinishReason::cancelled:
        return {503, "the request was cancelled: the server is shutting down", "server_error", "", "cancelled"};
      default:
        return {500, "generation failed: " + out.error, "server_error", "", ""};
    }
  }
  static bool failed(const RequestOutput& out) {
    return out.finish != FinishReason::stop && out.finish != FinishReason::length;
  }

  // OpenAI's logprobs object for generated tokens. Chat: {"content": [{token, logprob, bytes,
  // top_logprobs: [{token, logprob, bytes}]}], "refusal": null}. Completions: {tokens, token_logprobs,
  // top_logprobs (per token an object from token text to logprob: the alternatives and the chosen
  // token, so up to n + 1), text_offset (characters into the completion's text)}. A token's text is
  // its bytes in context, invalid UTF-8 (part of a character) shown as U+FFFD; `offset` carries the
  // text offset across a stream's chunks. `as_ids`: tokens named "token_id:N" instead of their text
  // (text offsets still count the text).
  static json logprobs_json(const std::vector<GeneratedLogprob>& lps, bool chat, int64_t& offset, bool as_ids) {
    // The text as the client will read it (invalid UTF-8 -> U+FFFD, as json_text writes it), so that
    // two tokens shown alike are one key of a completions top_logprobs object, not two keys that
    // collide in the client's parser (new-user trial 41: cut emoji bytes).
    auto name = [as_ids](const TokenLogprob& t) {
      return as_ids ? fmt::format("token_id:{}", t.id) : json::parse(json_text(json(t.bytes))).get<std::string>();
    };
    auto bytes = [](const std::string& b) {
      json a = json::array();
      for (unsigned char c : b) a.push_back(c);
      return a;
    };
    if (chat) {
      json content = json::array();
      for (const auto& g : lps) {
        json top = json::array();
        for (const auto& t : g.top) top.push_back({{"token", name(t)}, {"logprob", t.logprob}, {"bytes", bytes(t.bytes)}});
        content.push_back({{"token", name(g.token)},
                           {"logprob", g.token.logprob},
                           {"bytes", bytes(g.token.bytes)},
                           {"top_logprobs", std::move(top)}});
      }
      return {{"content", std::move(content)}, {"refusal", nullptr}};
    }
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), text_offset = json::array();
    for (const auto& g : lps) {
      tokens.push_back(name(g.token));
      token_logprobs.push_back(g.token.logprob);
      // the chosen token first (its key then agrees with token_logprobs), then the alternatives;
      // tokens shown alike keep the first (likelier) value
      json top = json::object();
      top[name(g.token)] = g.token.logprob;
      for (const auto& t : g.top)
        if (!top.contains(name(t))) top[name(t)] = t.logprob;
      top_logprobs.push_back(std::move(top));
      text_offset.push_back(offset);
      for (unsigned char c : g.token.bytes) offset += (c & 0xC0) != 0x80;  // characters: lead bytes
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_logprobs)},
            {"top_logprobs", std::move(top_logprobs)},
            {"text_offset", std::move(text_offset)}};
  }

  // Completions logprobs of an echoed prompt: its first token (no context: null logprob and
  // alternatives, as OpenAI's), then one entry per later prompt token, then `generated`'s.
  json echo_logprobs_json(const ParsedRequest& pr, const std::vector<int32_t>& prompt_ids,
                          const std::vector<GeneratedLogprob>& prompt_lps, const std::vector<GeneratedLogprob>& generated,
                          int64_t& offset) const {
    const Tokenizer* tok = s_.tokenizer.get();
    const int32_t first = prompt_ids.empty() ? -1 : prompt_ids[0];
    const std::string first_bytes = tok && first >= 0 ? tok->token_bytes(-1, first) : std::string();
    json head = {{"tokens", json::array({pr.tokens_as_ids ? fmt::format("token_id:{}", first)
                                                          : json::parse(json_text(json(first_bytes))).get<std::string>()})},
                 {"token_logprobs", json::array({nullptr})},
                 {"top_logprobs", json::array({nullptr})},
                 {"text_offset", json::array({offset})}};
    for (unsigned char c : first_bytes) offset += (c & 0xC0) != 0x80;
    for (const auto* part : {&prompt_lps, &generated}) {
      json j = logprobs_json(*part, false, offset, pr.tokens_as_ids);
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (auto& v : j[k]) head[k].push_back(std::move(v));
    }
    return head;
  }

  json chunk(const std::string& id, bool chat, int64_t created, json choice) {
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", o_.model_id},
            {"choices", json::array({std::move(choice)})}};
  }

  // The usage of a request's choices: each prompt's tokens once (OpenAI counts them once for n
  // choices) and its first choice's cached tokens; every choice's generated tokens.
  json usage(const ParsedRequest& pr, const std::vector<RequestOutput>& outs) {
    int64_t n_prompt = 0, n_generated = 0, n_cached = 0;
    for (size_t k = 0; k < outs.size(); ++k) {
      if (k % static_cast<size_t>(pr.n) == 0) {
        n_prompt += outs[k].n_prompt;
        n_cached += outs[k].n_cached;
      }
      n_generated += outs[k].n_generated;
    }
    return {{"prompt_tokens", n_prompt},
            {"completion_tokens", n_generated},
            {"total_tokens", n_prompt + n_generated},
            {"prompt_tokens_details", {{"cached_tokens", n_cached}}}};
  }

  // Collects every request's output for at most `limit`; true when all have ended or one failed.
  static bool wait_settled(const std::vector<std::shared_ptr<Request>>& reqs, std::vector<RequestOutput>& outs,
                           std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (size_t k = 0; k < reqs.size(); ++k) {
      const auto now = std::chrono::steady_clock::now();
      if (!wait_until_done(*reqs[k], outs[k], std::max(std::chrono::duration_cast<std::chrono::milliseconds>(until - now),
                                                       std::chrono::milliseconds(0))))
        return false;
      if (failed(outs[k])) return true;
    }
    return true;
  }
  static const RequestOutput* first_failure(const std::vector<RequestOutput>& outs) {
    for (const auto& o : outs)
      if (o.done && failed(o)) return &o;
    return nullptr;
  }

  void handle_generate(const httplib::Request& http_req, const std::string& body, httplib::Response& res, bool chat) {
    // Counted in flight until the response is written: shutdown waits for it. A stream hands the
    // count to its resource releaser, which runs when the stream ends or the client is gone.
    ++in_flight_;
    bool handed_over = false;
    struct Release {
      std::atomic<int>& n;
      bool& handed_over;
      ~Release() {
        if (!handed_over) --n;
      }
    } release{in_flight_, handed_over};
    auto pr = std::make_shared<const ParsedRequest>(parse(body, chat));
    auto signal = std::make_shared<RequestSignal>();
    auto reqs = std::make_shared<const std::vector<std::shared_ptr<Request>>>(submit_all(*pr, signal));
    struct CancelOnExit {  // a request the handler leaves without handing over (an exception) ends
      const std::vector<std::shared_ptr<Request>>& reqs;
      bool& handed_over;
      ~CancelOnExit() {
        if (!handed_over)
          for (auto& r : reqs) r->cancel();  // no-op for those that ended
      }
    } cancel_on_exit{*reqs, handed_over};
    const int64_t created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_++);
    const size_t n_choices = reqs->size();
    if (!pr->stream) {
      auto reply = [this, pr, id, created, chat](const std::vector<RequestOutput>& outs) {
        json choices = json::array();
        for (size_t k = 0; k < outs.size(); ++k) {
          const RequestOutput& out = outs[k];
          const PromptIn& in = pr->prompts[k / static_cast<size_t>(pr->n)];
          json choice = {{"index", k}};
          const char* finish = finish_name(out.finish);
          if (chat)
            std::tie(choice["message"], finish) = chat_message(*pr, out);
          else
            choice["text"] = pr->echo ? in.echo_text + out.text : out.text;
          int64_t offset = 0;
          choice["logprobs"] = pr->params.logprobs < 0 ? json(nullptr)
                               : pr->echo ? echo_logprobs_json(*pr, in.ids, out.prompt_logprobs, out.logprobs, offset)
                                          : logprobs_json(out.logprobs, chat, offset, pr->tokens_as_ids);
          choice["finish_reason"] = finish;
          if (pr->return_token_ids) choice["token_ids"] = out.token_ids;
          choices.push_back(std::move(choice));
        }
        return json{{"id", id},
                    {"object", chat ? "chat.completion" : "text_completion"},
                    {"created", created},
                    {"model", o_.model_id},
                    {"choices", std::move(choices)},
                    {"usage", usage(*pr, outs)}};
      };
      // A reply ready within heartbeat_after_ goes out whole, with its own status. A longer one is
      // sent chunked: JSON whitespace every heartbeat_every_ until the reply (the body is valid JSON
      // once concatenated), so that a client that went away fails a write and its request is
      // cancelled (cpp-httplib 0.11 tells a handler nothing about its connection). Its status is
      // then 200 and a later failure comes as an error object in the body, as in a stream.
      auto outs = std::make_shared<std::vector<RequestOutput>>(n_choices);
      if (wait_settled(*reqs, *outs, heartbeat_after_)) {
        if (const RequestOutput* f = first_failure(*outs)) return send_error(res, end_error(*f));
        res.set_content(json_text(reply(*outs)), "application/json");
        return;
      }
      handed_over = true;
      // "; charset=utf-8": cpp-httplib gzips "application/json" for a client that accepts it (the
      // openai client does), and its compressor held the heartbeats back, so a client that left
      // went unnoticed (new-user trial 52); this type is not compressed.
      set_streamed_content(http_req, res, "application/json; charset=utf-8",
          [this, reqs, outs, reply](size_t, httplib::DataSink& sink) {
            // A heartbeat right away (the reply is late already), then one per heartbeat_every_, all
            // within this one call: between calls cpp-httplib ends a chunked body once the server
            // stops listening (SIGTERM), which cut the reply of a request the drain was finishing.
            do {
              if (!sink.write(" ", 1)) {
                for (auto& r : *reqs) r->cancel();  // the client went away: its sequences end at the next step
                return false;
              }
            } while (!wait_settled(*reqs, *outs, heartbeat_every_));
            json j;
            if (const RequestOutput* f = first_failure(*outs)) {
              const HttpError e = end_error(*f);
              j = error_json(e.message, e.type, e.param, e.code);
            } else {
              j = reply(*outs);
            }
            const std::string body = json_text(j);
            sink.write(body.data(), body.size());
            sink.done();
            return true;
          },
          releaser(reqs));
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    handed_over = true;
    set_streamed_content(http_req, res, "text/event-stream",
        [this, reqs, signal, pr, id, created, chat](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            std::string s = "data: " + json_text(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          auto cancel_all = [&] {
            for (auto& r : *reqs) r->cancel();  // the client went away: its sequences end at the next step
            return false;
          };
          // With include_usage every chunk before the usage one says "usage": null, as OpenAI's do.
          auto ck = [&](const json& c) {
            json j = chunk(id, chat, created, c);
            if (pr->include_usage) j["usage"] = nullptr;
            return j;
          };
          // Each choice's chunks carry its index; choices interleave as their tokens come.
          struct ChoiceState {
            RequestOutput end;                   // the final counts
            std::vector<GeneratedLogprob> lps;  // of tokens whose chunk has not gone out yet
            int64_t offset = 0;
            bool echo_pending = false, done = false;
            std::string text;  // with tools: the reply so far, of which `sent` bytes went out as content
            size_t sent = 0;
            ReasoningSplitter think{false};  // with pr->reasoning: the <think> block goes out as reasoning_content
          };
          std::vector<ChoiceState> st(reqs->size());
          for (size_t k = 0; k < st.size(); ++k) {
            st[k].echo_pending = pr->echo;
            st[k].think = ReasoningSplitter(pr->reasoning_open);
            if (chat && !send(ck({{"index", k},
                                  {"delta", {{"role", "assistant"}, {"content", ""}}},
                                  {"logprobs", nullptr},
                                  {"finish_reason", nullptr}})))
              return cancel_all();
          }
          auto take_logprobs = [&](ChoiceState& c) -> json {
            if (pr->params.logprobs < 0 || c.lps.empty()) return nullptr;
            json j = logprobs_json(c.lps, chat, c.offset, pr->tokens_as_ids);
            c.lps.clear();
            return j;
          };
          // echo: the prompt's chunk first; with logprobs it waits for the prompt's entries, which
          // come with the first token (or the end).
          auto send_echo = [&](size_t k, std::vector<GeneratedLogprob>& prompt_lps) {
            st[k].echo_pending = false;
            const PromptIn& in = pr->prompts[k / static_cast<size_t>(pr->n)];
            json c = {{"index", k}, {"text", in.echo_text}};
            c["logprobs"] = pr->params.logprobs >= 0 ? echo_logprobs_json(*pr, in.ids, prompt_lps, {}, st[k].offset) : json(nullptr);
            c["finish_reason"] = nullptr;
            if (pr->return_token_ids) c["token_ids"] = json::array();
            return send(ck(c));
          };
          if (pr->echo && pr->params.logprobs < 0) {
            std::vector<GeneratedLogprob> none;
            for (size_t k = 0; k < st.size(); ++k)
              if (!send_echo(k, none)) return cancel_all();
          }
          size_t n_done = 0;
          for (;;) {
            const uint64_t seen = signal->count();
            bool news = false;
            for (size_t k = 0; k < st.size(); ++k) {
              ChoiceState& c = st[k];
              RequestOutput out;
              if (c.done || !(*reqs)[k]->wait(out, std::chrono::milliseconds(0))) continue;
              news = true;
              if (c.echo_pending && (out.done || !out.token_ids.empty() || !out.prompt_logprobs.empty())) {
                if (!(out.done && failed(out)) && !send_echo(k, out.prompt_logprobs)) return cancel_all();
              }
              std::move(out.logprobs.begin(), out.logprobs.end(), std::back_inserter(c.lps));
              std::string piece = std::move(out.text);
              if (pr->reasoning) {
                ReasoningParts parts = c.think.feed(piece);
                if (out.done) {
                  ReasoningParts tail = c.think.finish();
                  parts.reasoning += tail.reasoning;
                  parts.content += tail.content;
                }
                piece = std::move(parts.content);
                if (!parts.reasoning.empty() &&
                    !send(ck({{"index", k}, {"delta", {{"reasoning_content", parts.reasoning}}}, {"logprobs", take_logprobs(c)}, {"finish_reason", nullptr}})))
                  return cancel_all();
              }
              if (pr->tools != ToolFormat::none) {  // text from a call's marker on is held back
                c.text += piece;
                const size_t safe = pr->forced_prefix.empty() ? std::max(c.sent, tool_content_safe(pr->tools, c.text)) : 0;
                piece = c.text.substr(c.sent, safe - c.sent);
                c.sent = safe;
              }
              if (!piece.empty() || (!out.token_ids.empty() && pr->return_token_ids)) {
                json j = {{"index", k}};
                if (chat)
                  j["delta"] = {{"content", piece}};
                else
                  j["text"] = piece;
                j["logprobs"] = take_logprobs(c);
                j["finish_reason"] = nullptr;
                if (pr->return_token_ids) j["token_ids"] = out.token_ids;
                if (!send(ck(j))) return cancel_all();
              }
              if (!out.done) continue;
              c.done = true;
              ++n_done;
              if (failed(out)) {  // the stream ends with the error; the other choices are cancelled
                HttpError e = end_error(out);
                send(error_json(e.message, e.type, e.param, e.code));
                cancel_all();
                n_done = st.size();
                break;
              }
              c.end = std::move(out);
              const char* finish = finish_name(c.end.finish);
              if (pr->tools != ToolFormat::none) {  // the held text: calls, or content after all
                // (a forced call held all of it: c.sent is 0)
                const ToolReply tail = read_calls(*pr, c.text.substr(c.sent), c.end.finish);
                const std::string rest = tail.calls.empty() ? c.text.substr(c.sent) : tail.content;
                json lp = take_logprobs(c);
                if (!rest.empty()) {
                  if (!send(ck({{"index", k}, {"delta", {{"content", rest}}}, {"logprobs", lp}, {"finish_reason", nullptr}})))
                    return cancel_all();
                  lp = nullptr;
                }
                if (!tail.calls.empty()) {
                  if (!send(ck({{"index", k}, {"delta", {{"tool_calls", tool_calls_json(tail.calls, true, pr->tools)}}}, {"logprobs", lp},
                                {"finish_reason", nullptr}})))
                    return cancel_all();
                  if (c.end.finish == FinishReason::stop) finish = "tool_calls";  // "length" stays (see chat_message)
                }
              }
              json j = {{"index", k}};
              if (chat)
                j["delta"] = json::object();
              else
                j["text"] = "";
              j["logprobs"] = take_logprobs(c);  // tokens whose text was held back (a stop string)
              j["finish_reason"] = finish;
              if (!send(ck(j))) return cancel_all();
              if (n_done == st.size() && pr->include_usage) {
                std::vector<RequestOutput> ends;
                for (auto& x : st) ends.push_back(std::move(x.end));
                json u = {{"id", id},
                          {"object", chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", created},
                          {"model", o_.model_id},
                          {"choices", json::array()},
                          {"usage", usage(*pr, ends)}};
                send(u);
              }
            }
            if (n_done == st.size()) {
              std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
              sink.done();
              return true;
            }
            if (!news && !signal->wait_past(seen, heartbeat_every_)) {
              // Nothing for heartbeat_every_ (queued, a long prefill, a slow step): an SSE comment line,
              // which clients ignore, so that a client that went away fails a write and its requests
              // leave the queue (or the batch) now rather than when their first piece is written.
              static constexpr char kPing[] = ": ping\n\n";
              if (!sink.write(kPing, sizeof kPing - 1)) return cancel_all();
            }
          }
        },
        releaser(reqs));
  }

  // A chunked response's resource releaser: runs when it ends or the client is gone; the request
  // stops counting in flight.
  // A body written as it is made: chunked for HTTP/1.1; an HTTP/1.0 client does not know chunked
  // framing (RFC 9112 7.1), so its body goes unframed and ends when the connection closes.
  static void set_streamed_content(const httplib::Request& http_req, httplib::Response& res, const char* type,
                                   httplib::ContentProviderWithoutLength provider,
                                   httplib::ContentProviderResourceReleaser release) {
    if (http_req.version == "HTTP/1.0") {
      res.set_header("Connection", "close");
      res.set_content_provider(type, std::move(provider), std::move(release));
    } else {
      res.set_chunked_content_provider(type, std::move(provider), std::move(release));
    }
  }

  std::function<void(bool)> releaser(std::shared_ptr<const std::vector<std::shared_ptr<Request>>> reqs) {
    return [this, reqs](bool) {
      for (auto& r : *reqs) r->cancel();  // no-op for those that ended
      --in_flight_;
    };
  }

  // POST /v1/embeddings (OpenAI's): "input" a string, an array of strings, an array of token ids
  // or an array of such arrays (at most kMaxEmbedInputs); "encoding_format" float (default) or
  // base64 (float32 little-endian); "dimensions": the first N values (then normalized again, as
  // OpenAI's shortened embeddings: for models trained for it, Matryoshka). Texts get the
  // vocabulary's BOS / EOS. One request at a time (its inputs batched: runtime/embed.h).
  static constexpr size_t kMaxEmbedInputs = 2048;
  json embeddings(const std::string& body_text) {
    const json body = parse_body(body_text);
    if (const json* m = field(body, "model"); m && !m->is_string()) bad("model", "'model' must be a string");
    const json* input = field(body, "input");
    if (!input) bad("input", "'input' is required: a string, an array of strings or of token ids");
    std::vector<std::vector<int32_t>> inputs;
    auto ids_of = [&](const json& a, const std::string& where) {
      std::vector<int32_t> ids;
      for (const json& t : a) {
        if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
            t.get<int64_t>() < 0 || t.get<int64_t>() >= s_.hparams.n_vocab)
          bad("input", fmt::format("{}: {} is not a token id of the vocabulary [0, {})", where, clip_json(t), s_.hparams.n_vocab));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      if (ids.empty()) bad("input", fmt::format("{}: an empty array of token ids", where));
      return ids;
    };
    auto text_ids = [&](const json& t, const std::string& where) {
      if (!s_.tokenizer) bad("input", no_tokenizer(s_, o_.session.model_path, o_.model_id));
      const std::string& text = t.get_ref<const std::string&>();
      if (text.empty()) bad("input", fmt::format("{} is an empty string", where));
      if (const size_t off = first_invalid_utf8(text); off != std::string_view::npos)
        bad("input", fmt::format("{} is not valid UTF-8 (byte {})", where, off));
      return s_.tokenizer->encode(text, /*add_bos=*/true);
    };
    if (input->is_string()) {
      inputs.push_back(text_ids(*input, "'input'"));
    } else if (input->is_array() && !input->empty() && input->at(0).is_number()) {
      inputs.push_back(ids_of(*input, "'input'"));
    } else if (input->is_array() && !input->empty()) {
      if (input->size() > kMaxEmbedInputs)
        bad("input", fmt::format("'input' has {} items, at most {} are taken in one request", input->size(), kMaxEmbedInputs));
      for (size_t i = 0; i < input->size(); ++i) {
        const json& item = (*input)[i];
        const std::string where = fmt::format("input[{}]", i);
        if (item.is_string()) inputs.push_back(text_ids(item, where));
        else if (item.is_array()) inputs.push_back(ids_of(item, where));
        else bad("input", fmt::format("{} must be a string or an array of token ids, not {}", where, clip_json(item)));
      }
    } else {
      bad("input", input->is_array() ? "'input' is an empty array" : "'input' must be a string, an array of strings or of token ids");
    }
    bool b64 = false;
    if (const json* f = field(body, "encoding_format")) {
      if (!f->is_string() || (*f != "float" && *f != "base64"))
        bad("encoding_format", fmt::format("'encoding_format' must be \"float\" or \"base64\", not {}", clip_json(*f)));
      b64 = *f == "base64";
    }
    const int64_t n_embd = s_.hparams.n_embd;
    const int64_t dimensions = get_int(body, "dimensions", n_embd, 1, n_embd);
    const int64_t pool_rows = s_.backend->kv_pool_blocks() * s_.backend->kv_block_size();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(inputs[i].size());
      const std::string which = input->is_array() && !input->at(0).is_number() ? fmt::format("input[{}]", i) : std::string("'input'");
      if (n > s_.n_ctx)
        throw HttpError{400, fmt::format("{}: {} tokens are more than the context length {}", which, n, s_.n_ctx),
                        "invalid_request_error", "input", "context_length_exceeded"};
      if (pool_rows > 0 && n > pool_rows)
        throw HttpError{400, fmt::format("{}: {} tokens are more than the KV pool's {} rows (--kv-tokens)", which, n, pool_rows),
                        "invalid_request_error", "input", "context_length_exceeded"};
    }
    // Requests are embedded together: those waiting while a batch runs go in the next one
    // (EmbedBatcher); at most --parallel + --max-queue of them in all (429 beyond), each until its
    // --timeout (408) or a shutdown that cancels (503).
    struct Waiting {
      std::atomic<int>& n;
      ~Waiting() { --n; }
    } waiting{embed_requests_};
    if (++embed_requests_ > o_.parallel + o_.max_queue)
      throw HttpError{429, fmt::format("too many embedding requests at once (--parallel {} + --max-queue {})", o_.parallel, o_.max_queue),
                      "rate_limit_error", "", "queue_full"};
    const auto deadline = o_.timeout_s > 0 ? std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000))
                                           : std::chrono::steady_clock::time_point::max();
    const std::function<void()> check = [this, deadline] {
      if (cancel_embeddings_) throw HttpError{503, "the request was cancelled: the server is shutting down", "server_error", "", "cancelled"};
      if (std::chrono::steady_clock::now() >= deadline)
        throw HttpError{408, fmt::format("the request did not finish within {} s (--timeout)", o_.timeout_s), "timeout_error", "", "timeout"};
    };
    std::vector<std::vector<float>> vectors;
    try {
      vectors = embedder_->embed(inputs, dimensions, /*normalize=*/true, check);
    } catch (const Error& e) {  // what the checks above leave: a hidden state that overflowed
      throw HttpError{500, for_client(e.what()), "server_error", "", ""};
    }
    {
      std::lock_guard stats_lock(codes_mu_);
      ++embed_stats_.requests;
      embed_stats_.inputs += inputs.size();
      for (const auto& in : inputs) embed_stats_.tokens += in.size();
    }
    json data = json::array();
    int64_t n_tokens = 0;
    for (size_t i = 0; i < vectors.size(); ++i) {
      const std::vector<float>& v = vectors[i];
      json e = {{"object", "embedding"}, {"index", i}};
      e["embedding"] = b64 ? json(base64(v.data(), v.size() * sizeof(float))) : json(v);
      data.push_back(std::move(e));
      n_tokens += static_cast<int64_t>(inputs[i].size());
    }
    return {{"object", "list"},
            {"data", std::move(data)},
            {"model", o_.model_id},
            {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
  }

  // A known path asked with another method: 405 with the method it takes (RFC 9110 15.5.6); false
  // for another path or the path's own method.
  static bool method_not_allowed(const httplib::Request& req, httplib::Response& res) {
    static const std::map<std::string, std::string> kAllow = {{"/health", "GET"},
                                                              {"/v1/models", "GET"},
                                                              {"/metrics", "GET"},
                                                              {"/v1/completions", "POST"},
                                                              {"/v1/chat/completions", "POST"},
                                                              {"/v1/embeddings", "POST"},
                                                              {"/tokenize", "POST"},
                                                              {"/detokenize", "POST"}};
    const auto it = kAllow.find(req.path);
    if (it == kAllow.end() || it->second == req.method || (req.method == "HEAD" && it->second == "GET")) return false;
    res.status = 405;
    res.set_header("Allow", it->second);
    res.set_header("Connection", "close");  // its body is not read
    res.set_content(json_text(error_json(fmt::format("{} takes {}, not {}", req.path, it->second, req.method), "invalid_request_error", "", "")),
                    "application/json");
    return true;
  }

  void install(HttpServer& svr) {
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // No endpoint takes PUT, PATCH, DELETE or another method: refused before its body is read
      // (cpp-httplib 0.11 would wait for a body without Content-Length until its read timeout).
      if (req.method != "GET" && req.method != "HEAD" && req.method != "POST" && req.method != "OPTIONS") {
        if (!method_not_allowed(req, res)) {
          res.status = 405;
          res.set_header("Connection", "close");
          res.set_content(json_text(error_json(fmt::format("no endpoint takes {}", req.method), "invalid_request_error", "", "")),
                          "application/json");
        }
        return httplib::Server::HandlerResponse::Handled;
      }
      // A POST to a GET endpoint is a 405 whether or not it has a body (it was a 411 without one).
      if (req.method == "POST" && method_not_allowed(req, res)) return httplib::Server::HandlerResponse::Handled;
      // Runs before the body is read. cpp-httplib 0.11 does not apply the payload limit to chunked
      // bodies, so those are refused (411, as servers that need the length up front answer).
      if (req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos) {
        res.set_header("Connection", "close");
        send_error(res, {411, "chunked request bodies are not accepted: send the body with a Content-Length",
                         "invalid_request_error", "", ""});
        return httplib::Server::HandlerResponse::Handled;
      }
      // A POST with neither Content-Length nor Transfer-Encoding has no body (RFC 9112 6.3), but
      // cpp-httplib 0.11 would read until the connection closes (the read timeout): refuse it now.
      if (req.method == "POST" && !req.has_header("Content-Length")) {
        res.set_header("Connection", "close");
        send_error(res, {411, "a POST needs a Content-Length header (send the JSON body with its length)",
                         "invalid_request_error", "", ""});
        return httplib::Server::HandlerResponse::Handled;
      }
      // The length is judged from the header, before any body byte is read: one header, digits only
      // (RFC 9110 8.6; several differing ones are a request-smuggling vector), at most --max-body;
      // for any method that sends the header (a GET with two Content-Length headers is refused too).
      if (req.method == "POST" || req.has_header("Content-Length")) {
        const std::string cl = req.get_header_value("Content-Length");
        const bool numeric = !cl.empty() && cl.find_first_not_of("0123456789") == std::string::npos;
        if (req.get_header_value_count("Content-Length") != 1 || !numeric) {
          res.set_header("Connection", "close");
          send_error(res, {400, "the request needs exactly one Content-Length header holding a non-negative integer",
                           "invalid_request_error", "", ""});
          return httplib::Server::HandlerResponse::Handled;
        }
        if (cl.size() > 19 || std::stoull(cl) > o_.max_body) {
          res.set_header("Connection", "close");
          send_error(res, {413, fmt::format("the request body ({} bytes) is larger than --max-body {}", cl, o_.max_body),
                           "invalid_request_error", "", ""});
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (o_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (bearer_token(req.get_header_value("Authorization")) == o_.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("Connection", "close");  // its body is not read
      send_error(res, {401, "invalid or missing API key: send 'Authorization: Bearer KEY'", "invalid_request_error", "",
                       "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
    auto guarded = [this](auto fn) {
      return [this, fn](const httplib::Request& req, httplib::Response& res) {
        try {
          fn(req, res);
        } catch (const HttpError& e) {
          send_error(res, e);
        } catch (const std::exception& e) {
          send_error(res, {500, fmt::format("internal error: {}", e.what()), "server_error", "", ""});
        }
      };
    };
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      bool draining = draining_;
      res.status = draining ? 503 : 200;
      res.set_content(json_text(json{{"status", draining ? "shutting down" : "ok"}}), "application/json");
    });
    auto model_object = [this] {
      return json{{"id", o_.model_id},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "megakernel"},
                  {"meta", {{"n_ctx", e_.n_ctx()}, {"n_vocab", s_.hparams.n_vocab}, {"backend", s_.backend->name()}}}};
    };
    svr.Get("/v1/models", [model_object](const httplib::Request&, httplib::Response& res) {
      res.set_content(json_text(json{{"object", "list"}, {"data", json::array({model_object()})}}), "application/json");
    });
    // Retrieve one model (OpenAI's GET /v1/models/{model}): the served one, or 404 model_not_found.
    svr.Get(R"(/v1/models/(.+))", [this, model_object](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] == o_.model_id) return res.set_content(json_text(model_object()), "application/json");
      send_error(res, {404, fmt::format("the model '{}' does not exist; this server serves '{}'", req.matches[1].str(),
                                        o_.model_id),
                       "invalid_request_error", "model", "model_not_found"});
    });
    // The body is read here, whatever its Content-Type: cpp-httplib's own reading refuses an
    // application/x-www-form-urlencoded body (curl -d's default type) over 8 KiB with a bare 413,
    // a limit compiled into Debian's libcpp-httplib. --max-body is enforced before routing.
    auto with_body = [guarded](auto fn) {
      return [guarded, fn](const httplib::Request& q, httplib::Response& r, const httplib::ContentReader& read) {
        if (q.is_multipart_form_data()) {  // (its body would need multipart receivers): not read
          r.set_header("Connection", "close");
          return send_error(r, {415,
                                "the request body is multipart/form-data (curl -F); send a JSON object (Content-Type: "
                                "application/json, curl -d)",
                                "invalid_request_error", "", ""});
        }
        std::string body;
        const bool whole = read([&body](const char* data, size_t n) {
          body.append(data, n);
          return true;
        });
        if (!whole) return send_error(r, {400, "the request body could not be read", "invalid_request_error", "", ""});
        guarded([&](const httplib::Request& q2, httplib::Response& r2) { fn(q2, body, r2); })(q, r);
      };
    };
    // One kind of model per server, as llama.cpp's --embeddings: the other endpoints answer 501.
    auto not_served = [this](const char* what) {
      throw HttpError{501,
                      o_.embeddings ? fmt::format("this server serves embeddings only (started with --embeddings): {} need a server started without it", what)
                                    : std::string("this server does not serve embeddings: start it with --embeddings"),
                      "invalid_request_error", "", "not_supported"};
    };
    svr.Post("/v1/completions", with_body([this, not_served](const httplib::Request& q, const std::string& body, httplib::Response& r) {
               if (o_.embeddings) not_served("completions");
               handle_generate(q, body, r, false);
             }));
    svr.Post("/v1/chat/completions", with_body([this, not_served](const httplib::Request& q, const std::string& body, httplib::Response& r) {
               if (o_.embeddings) not_served("chat completions");
               handle_generate(q, body, r, true);
             }));
    svr.Post("/v1/embeddings", with_body([this, not_served](const httplib::Request&, const std::string& body, httplib::Response& r) {
               if (!o_.embeddings) not_served("embeddings");
               if (draining_) throw HttpError{503, "the server is shutting down", "server_error", "", ""};
               ++in_flight_;
               struct Release {
                 std::atomic<int>& n;
                 ~Release() { --n; }
               } release{in_flight_};
               r.set_content(json_text(embeddings(body)), "application/json");
             }));
    // llama.cpp server's /tokenize and /detokenize (clients count a prompt's tokens with them).
    svr.Post("/tokenize", with_body([this](const httplib::Request&, const std::string& body, httplib::Response& r) {
               r.set_content(json_text(tokenize(body)), "application/json");
             }));
    svr.Post("/detokenize", with_body([this](const httplib::Request&, const std::string& body, httplib::Response& r) {
               r.set_content(json_text(detokenize(body)), "application/json");
             }));
    svr.Get("/metrics", [this, &svr](const httplib::Request&, httplib::Response& res) {
      std::string text = prometheus_text(e_.stats());
      text +=
          "# HELP megakernel_http_responses_total HTTP responses by status code (0: the client left before its request was complete).\n# TYPE "
          "megakernel_http_responses_total counter\n";
      {
        std::lock_guard lock(codes_mu_);
        std::map<int, uint64_t> codes = codes_;
        if (const uint64_t t = svr.timeouts_sent()) codes[408] += t;  // the connection layer's 408s
        for (const auto& [code, n] : codes)
          text += fmt::format("megakernel_http_responses_total{{code=\"{}\"}} {}\n", code, n);
        if (o_.embeddings)
          for (const auto& [name, help, v] :
               {std::tuple{"embedding_requests_total", "Embedding requests served.", embed_stats_.requests},
                {"embedding_inputs_total", "Inputs embedded.", embed_stats_.inputs},
                {"embedding_tokens_total", "Tokens of the inputs embedded.", embed_stats_.tokens},
                {"embedding_batches_total", "Batches the embedding requests ran in (requests waiting at once share one).",
                 embedder_ ? embedder_->stats().batches : 0}})
            text += fmt::format("# HELP megakernel_{} {}\n# TYPE megakernel_{} counter\nmegakernel_{} {}\n", name, help, name, name, v);
      }
      res.set_content(text, "text/plain; version=0.0.4");
    });
    svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (res.status == 404 && method_not_allowed(req, res)) return httplib::Server::HandlerResponse::Handled;
      // cpp-httplib's own refusals (malformed request line or headers, sizes, no route) may leave
      // request bytes unread: the connection closes after them.
      res.set_header("Connection", "close");
      std::string msg = res.status == 404   ? "no such endpoint"
                        : res.status == 413 ? "the request body is too large (see --max-body)"
                        : res.status == 405 ? "method not allowed"
                        : res.status == 400 ? "malformed HTTP request (request line, headers or body framing)"
                        : res.status == 414 ? "the request URI is too long"
                                            : fmt::format("HTTP {}", res.status);
      res.set_content(json_text(error_json(msg, "invalid_request_error", "", "")), "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }));
    // Counted once the status is final (after the error handler) and before the first byte is
    // written, so a scrape made after a reply has ended always includes it (cpp-httplib's logger
    // runs after the write: a scrape could miss a reply its client had already read).
    svr.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
      // cpp-httplib adds Keep-Alive unless it closes the connection itself; a reply that closes it
      // (HTTP/1.0, an error whose body was not read) must not offer it too.
      if (res.get_header_value("Connection") == "close") {
        res.headers.erase("Keep-Alive");
        // cpp-httplib adds its own "Connection: close" to ours: one is enough (trial 34 saw two).
        if (res.headers.count("Connection") > 1) {
          res.headers.erase("Connection");
          res.set_header("Connection", "close");
        }
      }
      std::lock_guard lock(codes_mu_);
      // Code 0: the client left before its request was complete (cpp-httplib reports the failed
      // read as 400); a timed-out read was answered 408 by the connection layer, which counts it.
      if (!HttpServer::request_timed_out()) ++codes_[HttpServer::client_left() ? 0 : res.status];
    });
    svr.set_logger([](const httplib::Request&, const httplib::Response& res) {
      // A response that says Connection: close is the connection's last (HttpServer's loop).
      if (res.get_header_value("Connection") == "close") HttpServer::close_after_response();
    });
  }

  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  Pooling pooling_ = Pooling::mean;  // --embeddings: the vectors' pooling
  std::unique_ptr<EmbedBatcher> embedder_;    // --embeddings: concurrent requests embedded together
  std::atomic<int> embed_requests_{0};         // embedding requests running or waiting for embed_mu_
  std::atomic<bool> cancel_embeddings_{false};  // shutdown: they end at their next step (503)
  struct {
    uint64_t requests = 0, inputs = 0, tokens = 0;  // served (under codes_mu_)
  } embed_stats_;

 private:
  ServeOptions o_;
  Session& s_;
  Engine& e_;
  bool no_chat_template_ = false;  // no --chat-template-file and the model carries none (or a broken one)
  ToolFormat tool_format_ = ToolFormat::none;  // how the chat template's model calls tools (runtime/tool_calls.h)
  std::vector<int32_t> tool_marker_ids_;          // its markers that are control tokens (tool_marker_tokens)
  bool thinks_ = false;                        // the chat template writes <think> (runtime/reasoning.h)
  std::atomic<uint64_t> next_id_{1};
  std::mutex codes_mu_;
  std::map<int, uint64_t> codes_;
};

// host:port resolved as cpp-httplib resolves the listening address (getaddrinfo, passive, TCP);
// null when it does not resolve (bind_error says why). Free with freeaddrinfo.
addrinfo* listen_addresses(const std::string& host, int port, int* gai_status = nullptr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai_status) *gai_status = rc;
  return rc == 0 ? res : nullptr;
}

// Why host:port cannot be bound, for the error message (cpp-httplib 0.11 reports only failure): not
// a valid address, or the errno of binding each address it resolves to.
std::string bind_error(const std::string& host, int port) {
  int rc = 0;
  addrinfo* res = listen_addresses(host, port, &rc);
  if (!res) return fmt::format("'{}' is not a valid address or host name ({})", host, gai_strerror(rc));
  std::string why = "the address cannot be bound";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const int err = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    ::close(fd);
    if (err == EADDRNOTAVAIL) why = fmt::format("{} is not an address of this machine", host);
    else if (err == EADDRINUSE) why = fmt::format("port {} is in use", port);
    else if (err != 0) why = std::strerror(err);
  }
  freeaddrinfo(res);
  return why;
}

void serve(ServeOptions o) {
  // Signals are taken by a dedicated thread (sigwait), so block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that disconnects must not kill the server

  if (o.port < 0 || o.port > 65535) fail("--port must be in [0, 65535], got {}", o.port);
  // An address that does not resolve is refused before the model loads.
  if (addrinfo* a = listen_addresses(o.host, o.port))
    freeaddrinfo(a);
  else
    fail("cannot listen on {}:{}: {}", o.host, o.port, bind_error(o.host, o.port));
  if (o.timeout_s < 0) fail("--timeout must be >= 0, got {}", o.timeout_s);
  o.session.need_tokenizer = false;
  o.session.tokenizer_if_available = true;
  if (o.kv_tokens < 0) fail("--kv-tokens must be >= 0, got {}", o.kv_tokens);
  o.session.kv_pool_tokens = o.kv_tokens;
  o.session.kv_pool_seqs = o.parallel;  // default pool: every running request can reach the full context
  o.session.embeddings = o.embeddings;
  if (!o.pooling.empty() && !o.embeddings) throw CLI::ValidationError("--pooling", "needs --embeddings");
  if (o.pooling == "none") throw CLI::ValidationError("--pooling", "none gives a vector per token, which /v1/embeddings cannot return: use mean, cls or last");
  // The KV pool and the per-row buffers grow with --parallel, the context and --kv-tokens: an
  // allocation that fails names them, so the user knows what to lower.
  std::unique_ptr<Session> session;
  auto memory_hint = [&](const std::string& what) {
    fail("{}: the KV cache and buffers sized by --parallel {}, -c {} and --kv-tokens {} do not fit: lower --parallel, "
         "-c or --kv-tokens (-c 0 is the model's context; --kv-tokens 0 is --parallel x the context)",
         what, o.parallel, o.session.n_ctx, o.kv_tokens);
  };
  try {
    session = std::make_unique<Session>(o.session);
  } catch (const std::bad_alloc&) {
    memory_hint("out of memory");
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.find("cannot allocate") == std::string::npos && m.find("out of memory") == std::string::npos &&
        m.find("OUT_OF_MEMORY") == std::string::npos)
      throw;
    memory_hint(m);
  }
  Session& s = *session;
  // A request needs its prompt (at least one token) and room for one more position.
  if (s.n_ctx < 2) fail("-c {}: a context of one position leaves no room to serve a request (a prompt and a token after it)", s.n_ctx);
  if (!s.tokenizer_error.empty())
    std::fprintf(stderr, "warning: the model's tokenizer cannot be used (%s); only prompts of token ids can be served\n",
                 s.tokenizer_error.c_str());
  Pooling pooling = Pooling::mean;
  if (o.embeddings) {
    pooling = o.pooling.empty() ? model_pooling(s.model) : pooling_from_name(o.pooling);
    if (pooling == Pooling::none)
      fail("{}: the model's pooling is none (a vector per token), which /v1/embeddings cannot return: pass --pooling mean, cls or last",
           o.session.model_path);
  }
  if (o.embeddings) {
    if (!o.template_file.empty()) throw CLI::ValidationError("--chat-template-file", "an --embeddings server does not chat");
  } else if (!o.template_file.empty()) {  // a template that cannot be read or parsed is the server's error, found at start
    if (!s.tokenizer) fail("--chat-template-file: {}, so it cannot chat", no_tokenizer(s));
    render_model_chat(s.model, *s.tokenizer, json::array({{{"role", "user"}, {"content", "Hello"}}}), o.template_file);
  } else if (s.tokenizer) {  // a model without a template serves completions only: say so at start
    bool has_template = false;
    try {
      model_chat_template(s.model);
      has_template = true;
    } catch (const Error& e) {
      std::fprintf(stderr, "note: %s; chat completions will be refused\n", e.what());
    }
    // The model's own template is the file's business, not refused at start as the operator's
    // --chat-template-file is; one that fails on a one-message chat (a syntax error fails every
    // request) is named at start, before clients find out.
    if (has_template) try {
        render_model_chat(s.model, *s.tokenizer, json::array({{{"role", "user"}, {"content", "Hello"}}}));
      } catch (const Error& e) {
        std::fprintf(stderr,
                     "warning: the model's chat template fails on a one-message chat (%s); chat completions will likely "
                     "fail (--chat-template-file gives another template)\n",
                     e.what());
      }
  }
  if (o.model_id.empty()) {
    std::filesystem::path p(o.session.model_path);
    o.model_id =
        o.session.model_path.rfind("synth:", 0) == 0 ? o.session.model_path : p.filename().replace_extension().string();
    if (o.model_id.empty()) o.model_id = p.parent_path().filename().string();
  }
  EngineOptions eo;
  eo.parallel = o.parallel;
  eo.max_queue = o.max_queue;
  eo.n_ctx = s.n_ctx;
  eo.n_vocab = s.hparams.n_vocab;
  eo.stop_at_bos = s.stop_at_bos;
  eo.prefix_cache = o.prefix_cache;
  Engine engine(*s.backend, s.tokenizer.get(), eo);
  if (!engine.paged() && o.parallel > 1)
    std::fprintf(stderr, "note: backend '%s' has no paged KV cache: requests run one at a time\n",
                 s.backend->name().c_str());
  else if (engine.parallel() < o.parallel)  // the KV pool was sized for the lower count too (Session::kv_pool_seqs)
    std::fprintf(stderr, "note: --parallel %d is more than the %d rows a step takes (the backend's batch, at most the context): %d requests run at once\n",
                 o.parallel, engine.parallel(), engine.parallel());
  engine.start();

  Server server(o, s, engine);
  server.pooling_ = pooling;
  if (o.embeddings)
    server.embedder_ = std::make_unique<EmbedBatcher>(*s.backend, s.hparams.n_embd, s.n_ctx, s.hparams.n_vocab, pooling);
  HttpServer svr;  // cpp-httplib with our connection loop: http_connections.h
  // Threads kept ready for connections; more start on demand (a slow client never holds back others).
  const size_t http_threads = static_cast<size_t>(std::max(engine.parallel(), 1) + o.max_queue + 4);
  svr.new_task_queue = [http_threads] {
    return new ConnectionPool(http_threads, std::max(kMaxConnectionThreads, http_threads));
  };
  svr.set_payload_max_length(o.max_body);
  // Slow clients: no read of a request may wait more than 10 s, and the whole request (line,
  // headers, body) must arrive within MK_SERVE_REQUEST_READ_MS of its first byte (408 otherwise).
  svr.set_read_timeout(10, 0);
  svr.request_read_limit = env_ms("MK_SERVE_REQUEST_READ_MS", 30000);
  svr.set_write_timeout(10, 0);
  svr.set_keep_alive_timeout(5);
  server.install(svr);
  // cpp-httplib 0.11 listens with a backlog of 5: simultaneous new connections beyond it were seen
  // reset under load. Keep the listening socket (these options apply to it only) and deepen it.
  int listen_fd = -1;
  svr.set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // what httplib's default does
    listen_fd = static_cast<int>(sock);
  });
  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port < 0) fail("cannot listen on {}:0 (any free port): {}", o.host, bind_error(o.host, 0));
  } else if (!svr.bind_to_port(o.host, port)) {
    fail("cannot listen on {}:{}: {}", o.host, port, bind_error(o.host, port));
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);  // on Linux, listen() again sets the new backlog

  // SIGTERM/SIGINT: the listener closes at once (new connections are refused; requests arriving on
  // open connections get 503) and idle connections close; requests in flight finish for up to
  // MK_SERVE_DRAIN_MS (default 30 s), then the rest are cancelled (a second signal cancels them at
  // once), and every connection is closed. listen_after_bind() returns when all have ended.
  const std::chrono::milliseconds drain_limit = env_ms("MK_SERVE_DRAIN_MS", 30000);
  std::atomic<int> signals{0};
  std::atomic<bool> exiting{false}, listen_done{false}, cancel_now{false};
  std::thread drainer;
  std::thread watcher([&] {
    int sig = 0;
    while (sigwait(&sigs, &sig) == 0) {
      if (exiting) break;
      if (sig != SIGTERM && sig != SIGINT) continue;
      if (++signals == 1) {
        std::fprintf(stderr,
                     "serve: %s: listener closed; finishing the requests in flight for up to %lld ms (signal again to "
                     "cancel them)\n",
                     sig == SIGTERM ? "SIGTERM" : "SIGINT", static_cast<long long>(drain_limit.count()));
        server.draining_ = true;
        engine.begin_drain();
        drainer = std::thread([&] {
          // The listener is closed once listening has started (a signal during start waits for it).
          while (!svr.is_running() && !listen_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          if (!listen_done) svr.stop();
          svr.stop_idle();
          auto idle = [&] {
            EngineStats st = engine.stats();
            return st.queue_depth == 0 && st.running == 0 && server.in_flight_ == 0;
          };
          const auto until = std::chrono::steady_clock::now() + drain_limit;
          while (!idle() && !cancel_now && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          if (!idle()) {
            std::fprintf(stderr, "serve: cancelling the requests still in flight\n");
            server.cancel_embeddings_ = true;
            engine.shutdown(true);
            // The cancelled requests' replies (503, or an error event in a stream) get a moment to go out.
            const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            while (server.in_flight_ != 0 && std::chrono::steady_clock::now() < grace)
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          svr.hard_stop();  // what is left (a client still sending or not reading) is closed
        });
      } else {
        cancel_now = true;
      }
    }
  });
  if (const int64_t pool = engine.kv_blocks_total() * engine.kv_block_size(); o.kv_tokens > 0 && pool != o.kv_tokens)
    std::fprintf(stderr, "note: --kv-tokens %lld is %lld KV rows: whole blocks of %lld tokens\n",
                 static_cast<long long>(o.kv_tokens), static_cast<long long>(pool),
                 static_cast<long long>(engine.kv_block_size()));
  // A pool smaller than one request at full context: every request must then set max_tokens (each
  // 400 says so; new-user trial 45 asked for the note up front).
  if (!o.embeddings && engine.paged() && engine.kv_blocks_total() * engine.kv_block_size() < engine.n_ctx())
    std::fprintf(stderr,
                 "note: the KV pool (%lld rows) is smaller than one request at the full context (%lld): requests must set "
                 "max_tokens so that prompt + max_tokens fit in it\n",
                 static_cast<long long>(engine.kv_blocks_total() * engine.kv_block_size()), static_cast<long long>(engine.n_ctx()));
  std::fprintf(
      stderr,
      "serve: %s%s on %s backend, context %lld, %d parallel, KV %lld %s x %lld tokens; listening on http://%s:%d\n",
      o.model_id.c_str(), o.embeddings ? fmt::format(" (embeddings, {} pooling)", pooling_name(pooling)).c_str() : "",
      s.backend->name().c_str(), static_cast<long long>(engine.n_ctx()), engine.parallel(),
      static_cast<long long>(engine.kv_blocks_total()), engine.kv_blocks_total() == 1 ? "block" : "blocks",
      static_cast<long long>(engine.kv_block_size()),
      (o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host).c_str(), port);  // IPv6 in brackets
  std::fflush(stderr);
  bool ok = svr.listen_after_bind();
  listen_done = true;
  engine.shutdown(true);
  exiting = true;
  pthread_kill(watcher.native_handle(), SIGTERM);  // wakes sigwait (the signal is blocked: no handler runs)
  watcher.join();
  if (drainer.joinable()) drainer.join();
  s.backend->finish();
  if (!ok && signals == 0) fail("the HTTP server stopped unexpectedly");
  const EngineStats st = engine.stats();
  std::fprintf(stderr, "serve: stopped (KV blocks used: %lld)\n", static_cast<long long>(st.kv_blocks_used));
}
}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  cmd->add_option("-m,--model", o->session.model_path, "model: GGUF file, llama2.c .bin, HF directory, synth:<name>")
      ->required();
  cmd->add_option("-z,--tokenizer", o->session.tokenizer_path, "tokenizer file (llama2.c tokenizer.bin, or an HF tokenizer.json)");
  // An empty value is refused rather than taken as "the default" or "any" (it listened on [::1]
  // and printed "http://:PORT").
  const CLI::Validator not_empty([](std::string& s) { return s.empty() ? std::string("must not be empty") : std::string(); },
                                 "TEXT");
  cmd->add_option("--host", o->host, "address to listen on (default 127.0.0.1: this machine only)")->check(not_empty);
  cmd->add_option("--port", o->port, "TCP port (0 = any free port; the chosen one is printed)")
      ->capture_default_str()
      ->transform(integer_range(0, 65535));
  cmd->add_option("--parallel", o->parallel, "most requests generating at once (one batch)")
      ->capture_default_str()
      ->transform(integer_range(1, 1 << 16));
  cmd->add_option("--max-queue", o->max_queue, "requests waiting beyond --parallel; more get HTTP 429")
      ->capture_default_str()
      ->transform(integer_at_least(0));
  cmd->add_option("--kv-tokens", o->kv_tokens, "KV cache rows shared by all requests (0 = --parallel x context)")
      ->capture_default_str()
      ->transform(integer_range(0, int64_t{1} << 30));
  // An empty key would turn authentication off without a word (a script's unset $KEY): refused.
  cmd->add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' (all endpoints but /health)")
      ->check(not_empty);
  cmd->add_option("--timeout", o->timeout_s, "seconds a request may take from arrival to its end (0 = none)")
      ->capture_default_str()
      ->transform(number_range(0, kMaxTimeoutS));
  cmd->add_option("--max-body", o->max_body, "largest request body in bytes (larger: HTTP 413)")
      ->capture_default_str()
      ->transform(integer_range(1, kMaxBodyLimit));
  cmd->add_flag("!--no-prefix-cache", o->prefix_cache,
                "compute every prompt in full (default: a prompt that begins as an earlier request's did, in whole "
                "KV blocks, reuses that request's KV cache rows)");
  cmd->add_option("--chat-template-file", o->template_file, "Jinja2 chat template to use instead of the model's");
  cmd->add_option("--reasoning-format", o->reasoning_format,
                  "deepseek: a chat reply's <think> block goes to reasoning_content (templates that write <think>: Qwen3, "
                  "DeepSeek-R1); none: it stays in the content")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "deepseek"}));
  cmd->add_option("--draft", o->draft,
                  "prompt lookup decoding: draft up to N tokens from the prompt and reply, checked in the step's batch; "
                  "the same tokens as without, sampled ones for a seed too (not for JSON replies; 0 = off)")
      ->transform(integer_range(0, 255));
  cmd->add_flag("--embeddings", o->embeddings,
                "serve POST /v1/embeddings (the last hidden state, pooled, L2-normalized) instead of completions");
  cmd->add_option("--pooling", o->pooling, "with --embeddings: mean, cls or last (default: the model's, else mean)")
      ->check(CLI::IsMember({"none", "mean", "cls", "last"}));
  cmd->add_option("--alias", o->model_id, "model id reported by /v1/models and in responses (default: the file name)")
      ->check(not_empty);
  cmd->add_option("-c,--ctx-size", o->session.n_ctx, "context length per request (0 = the model's, at most 4096)")
      ->transform(integer_at_least(0));
  cmd->add_option("--backend", o->session.backend, "backend: cpu, cuda, ... (default: the fastest available)")
      ->check(backend_name());
  refuse_threads_for_reference(cmd, o->session.backend, o->session.backend_options.threads);
  cmd->add_option("-t,--threads", o->session.backend_options.threads, "workers: cpu threads (0 = all cores, at most 1024); cuda and cuda-emu blocks (0 = one per SM; cuda-emu 4)")
      ->transform(integer_range(0, 1024));
  cmd->add_option("--schedule", o->session.backend_options.schedule, "CPU schedule: dynamic, static-rr, static-cp")
      ->check(schedule_name());
  cmd->callback([o] { serve(*o); });
}

}  // namespace mk::cli
