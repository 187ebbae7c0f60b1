#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "runtime/chat.h"
#include "runtime/session.h"
#include "support/error.h"

namespace mk::cli {

void add_run_command(CLI::App& app) {
  struct Opts {
    SessionOptions session;
    GenerateOptions gen;
    bool json = false;
    std::string ids;
    std::string messages_file, system, template_file;
    std::string json_schema;
    bool chat = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("run", "generate text from a prompt");
  cmd->add_option("-m,--model", o->session.model_path, "model: GGUF file, llama2.c .bin, HF directory, synth:<name>")->required();
  cmd->add_option("-z,--tokenizer", o->session.tokenizer_path, "tokenizer file (llama2.c tokenizer.bin, or an HF tokenizer.json)");
  auto* prompt = cmd->add_option("-p,--prompt", o->gen.prompt, "prompt text");
  auto* ids = cmd->add_option("--ids", o->ids, "prompt as comma-separated token ids (no BOS added); works without a tokenizer")
                  ->excludes(prompt)
                  ->check(token_ids());
  cmd->add_option("-n,--n-predict", o->gen.n_new, "number of tokens to generate")->capture_default_str()->transform(integer_at_least(0));
  add_generation_options(cmd, o->session, o->gen.sampler);
  cmd->add_option("--schedule", o->session.backend_options.schedule, "CPU schedule: dynamic, static-rr, static-cp")
      ->check(schedule_name());
  cmd->add_option("--attn-splits", o->session.backend_options.attn_splits,
                  "flash-decoding: split each row's cached positions N ways (0 = auto; default 1 on cpu, auto on cuda)")
      ->transform(integer_range(0, 64));
  cmd->add_option("--trace", o->session.backend_options.trace_path, "write a Chrome/Perfetto trace to this file")
      ->check(CLI::Validator([](std::string& s) { return s.empty() ? std::string("must not be empty") : std::string(); }, "FILE"));
  cmd->add_flag("--ignore-eos", o->gen.ignore_eos, "keep generating past end-of-sequence");
  cmd->add_option("--draft", o->gen.draft,
                  "prompt lookup decoding: draft up to N tokens from the text so far (what followed its last words before) "
                  "and check them in one step; the same tokens as without, sampled ones for a seed too (0 = off)")
      ->transform(integer_range(0, 255));
  auto* json_flag = cmd->add_flag("--json", o->json, "print one JSON object instead of streaming text");
  cmd->add_option("--logprobs", o->gen.logprobs,
                  "with --json: each generated token's log-probability (the model's own, before temperature and "
                  "penalties) and the N most likely tokens")
      ->transform(integer_range(0, kMaxTopLogprobs))
      ->needs(json_flag);
  auto* messages = cmd->add_option("--messages", o->messages_file,
                                   "chat: a JSON file with [{\"role\": .., \"content\": ..}, ...], rendered by the model's template "
                                   "(- = standard input)");
  auto* chat = cmd->add_flag("--chat", o->chat, "chat: the prompt (-p) is one user turn, rendered by the model's template");
  auto* system = cmd->add_option("--system", o->system, "chat: a system message before the user turn (with --chat; \"\" = an empty one)")->needs(chat);
  cmd->add_option("--chat-template-file", o->template_file, "chat: Jinja2 template to use instead of the model's");
  auto* json_schema_opt = cmd->add_option("-j,--json-schema", o->json_schema,
                  "the reply is one JSON object of this JSON Schema (as serve's response_format json_schema; "
                  "'{\"type\": \"object\"}' = any object); generation stops when it closes (stop_reason \"json\")");
  messages->excludes(chat);
  messages->excludes(ids);
  chat->excludes(ids);
  cmd->callback([o, ids, system, json_schema_opt] {
    if (o->chat && o->gen.prompt.empty()) usage_error("--chat needs the user's text with -p TEXT (not empty)");
    if (!o->messages_file.empty() && !o->gen.prompt.empty()) usage_error("--messages and -p cannot be combined");
    if (!o->template_file.empty() && !o->chat && o->messages_file.empty())
      usage_error("--chat-template-file needs --chat or --messages");
    if (json_schema_opt->count() > 0 && o->json_schema.empty()) usage_error("--json-schema is empty: give a schema, e.g. '{\"type\": \"object\"}'");
    if (!o->json_schema.empty()) {  // checked before the model loads
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(o->json_schema);
      } catch (const nlohmann::json::exception& e) {
        usage_error(fmt::format("--json-schema is not valid JSON: {}", e.what()));
      }
      try {
        o->gen.json = JsonSchema::compile(schema);
      } catch (const Error& e) {
        usage_error(fmt::format("--json-schema: {}", e.what()));
      }
    }
    if (ids->count() > 0) {  // a tokenizer only decodes the output: synthetic models have none
      o->gen.prompt_ids = parse_ids(o->ids);
      o->session.need_tokenizer = false;
      o->session.tokenizer_if_available = true;
    }
    // A messages file is read and checked before the model loads: its errors come at once.
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    if (!o->messages_file.empty()) msgs = read_chat_messages(o->messages_file);
    Session s(o->session);
    try {  // ids past the vocabulary, known once the model is loaded: a usage error as the others
      check_logit_bias(o->gen.sampler, s.hparams.n_vocab);
    } catch (const Error& e) {
      usage_error(fmt::format("--logit-bias: {}", e.what()));
    }
    if (!s.tokenizer_error.empty())
      std::fprintf(stderr, "warning: the model's tokenizer cannot be used (%s); printing token ids only\n",
                   s.tokenizer_error.c_str());
    const bool chat_mode = o->chat || !o->messages_file.empty();
    if (chat_mode) {
      if (o->messages_file.empty()) {
        if (system->count() > 0) msgs.push_back({{"role", "system"}, {"content", o->system}});  // "" too
        msgs.push_back({{"role", "user"}, {"content", o->gen.prompt}});
      }
      o->gen.prompt = render_model_chat(s.model, *s.tokenizer, msgs, o->template_file);
      o->gen.add_bos = false;  // the template writes the special tokens it wants
    }
    const std::string no_draft = draft_unused_reason(s, o->gen);
    if (!no_draft.empty()) std::fprintf(stderr, "note: --draft is off: %s\n", no_draft.c_str());
    GenerateResult r;
    if (o->json) {
      r = generate(s, o->gen);
      s.backend->finish();  // traces and summaries go to files and stderr, stdout stays one JSON object
      nlohmann::ordered_json j;
      if (ids->count() > 0) j["rendered"] = nullptr;  // the prompt came as ids: there is no text
      else j["rendered"] = o->gen.prompt;
      j["prompt_ids"] = r.prompt_ids;
      j["generated_ids"] = r.generated_ids;
      j["text"] = r.text;
      if (o->gen.logprobs >= 0) {  // token: its bytes in context, as text (part of a character: U+FFFD)
        auto entry = [](const TokenLogprob& t) {
          return nlohmann::ordered_json{{"id", t.id}, {"token", t.bytes}, {"logprob", t.logprob}};
        };
        nlohmann::ordered_json lps = nlohmann::ordered_json::array();
        for (const GeneratedLogprob& g : r.logprobs) {
          nlohmann::ordered_json e = entry(g.token), top = nlohmann::ordered_json::array();
          for (const TokenLogprob& t : g.top) top.push_back(entry(t));
          e["top_logprobs"] = std::move(top);
          lps.push_back(std::move(e));
        }
        j["logprobs"] = std::move(lps);
      }
      // No decode step (-n 0, or the one token from the prompt's step): no rate, not an "infinitely fast" 0.
      if (r.n_decode_steps > 0) j["ms_per_token"] = r.ms_per_token();
      else j["ms_per_token"] = nullptr;
      j["prompt_ms_per_token"] = r.prompt_ms_per_token();
      j["backend"] = s.backend->name();
      j["stop_reason"] = r.stop_reason;
      if (o->gen.draft > 0) {
        j["n_drafted"] = r.n_drafted;
        j["n_draft_accepted"] = r.n_draft_accepted;
      }
      std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());  // bytes of a prompt that is not UTF-8: U+FFFD
      return;
    }
    o->gen.echo_prompt = !chat_mode;  // a chat prints the answer only
    const bool ids_only = !s.tokenizer;  // no tokenizer: print the generated ids, space-separated
    StreamOut out;
    try {
      r = generate(
          s, o->gen, [&](const std::string& t) { out.put(t); },
          [&, first = true](int32_t id) mutable {
            if (!ids_only) return;
            out.put((first ? "" : " ") + std::to_string(id));
            first = false;
          });
    } catch (...) {
      out.end_line();  // the error (stderr) then starts a line of its own
      throw;
    }
    std::printf("\n");
    std::fflush(stdout);
    s.backend->finish();
    if (r.stop_reason == "context")
      std::fprintf(stderr, "note: stopped: the context (%lld token%s) is full\n", static_cast<long long>(s.n_ctx),
                   s.n_ctx == 1 ? "" : "s");
    // The first generated token comes from the prompt's step: with none after it there is no decode
    // rate to give (it printed "0.000 ms/token (0.0 tokens/s)").
    const std::string rate = r.n_decode_steps > 0 ? fmt::format("{:.3f} ms/token ({:.1f} tokens/s)", r.ms_per_token(),
                                                                r.ms_per_token() > 0 ? 1000.0 / r.ms_per_token() : 0.0)
                                                  : std::string("no decode step");
    auto tokens = [](size_t n) { return fmt::format("{} {}", n, n == 1 ? "token" : "tokens"); };
    std::fprintf(stderr, "[%s] prompt: %s, %.3f ms/token | generation: %s, %s%s\n", s.backend->name().c_str(),
                 tokens(r.prompt_ids.size()).c_str(), r.prompt_ms_per_token(), tokens(r.generated_ids.size()).c_str(),
                 rate.c_str(),
                 o->gen.draft > 0 && no_draft.empty()
                     ? fmt::format(" | lookup: {} of {} drafted tokens accepted", r.n_draft_accepted, r.n_drafted).c_str()
                     : "");
  });
}

}  // namespace mk::cli
