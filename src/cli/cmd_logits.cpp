#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "support/error.h"

namespace mk::cli {

std::string token_ids_problem(const std::string& s) {
  if (s.empty()) return "no token ids given";
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(s.data() + i, s.data() + j, v);
    if (ec != std::errc() || p != s.data() + j) return fmt::format("'{}' is not a token id", s.substr(i, j - i));
    if (v < 0) return fmt::format("'{}' is not a token id (ids are 0 or more)", s.substr(i, j - i));
    i = j + 1;
  }
  return {};
}

std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag) {
  if (const std::string p = token_ids_problem(s); !p.empty()) fail("{}: {}", flag, p);
  std::vector<int32_t> ids;
  for (size_t i = 0; i <= s.size();) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    int32_t v = 0;
    std::from_chars(s.data() + i, s.data() + j, v);
    ids.push_back(v);
    i = j + 1;
  }
  return ids;
}

CLI::Validator token_ids() {
  return CLI::Validator([](std::string& s) { return token_ids_problem(s); }, "ID,ID,...");
}

void add_logits_command(CLI::App& app) {
  auto o = std::make_shared<SessionOptions>();
  auto ids = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("logits", "print the logits of a token sequence as JSON");
  cmd->add_option("-m,--model", o->model_path, "model")->required();
  cmd->add_option("--ids", *ids, "comma-separated token ids")->required()->check(token_ids());
  cmd->add_option("--backend", o->backend, "backend")->check(backend_name());
  refuse_threads_for_reference(cmd, o->backend, o->backend_options.threads);
  cmd->add_option("-t,--threads", o->backend_options.threads, "workers: cpu threads (0 = all cores, at most 1024); cuda and cuda-emu blocks (0 = one per SM; cuda-emu 4)")
      ->transform(integer_range(0, 1024));
  cmd->add_option("--act-quant", o->backend_options.act_quant,
                  "cpu: quantize matmul activations to 8-bit blocks as llama.cpp does: auto (on for GGUF files and synth: models with "
                  "block-quantized weights), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--attn-splits", o->backend_options.attn_splits,
                  "flash-decoding: split each row's cached positions N ways (0 = auto; default 1 on cpu, auto on cuda)")
      ->transform(integer_range(0, 64));
  cmd->add_option("--kv-type", o->backend_options.kv_type,
                  "cpu: KV cache precision as llama.cpp's: f16, f32, or auto (f16 for GGUF files and synth: models with block-quantized "
                  "weights, else f32)")
      ->check(CLI::IsMember({"auto", "f16", "f32"}));
  cmd->add_option("--schedule", o->backend_options.schedule, "CPU schedule")
      ->check(schedule_name());
  auto n_ctx = std::make_shared<int64_t>(0);
  cmd->add_option("-c,--ctx-size", *n_ctx,
                  "context length (default: the number of ids); models whose RoPE depends on the context "
                  "(phi3 LongRoPE) give run's logits with run's -c")
      ->transform(integer_at_least(0));
  cmd->callback([o, ids, n_ctx] {
    o->all_logits = true;
    o->need_tokenizer = false;
    std::vector<int32_t> tok = parse_ids(*ids);
    // Session rejects more than the training context; the logits buffer holds n_ctx rows.
    if (*n_ctx > 0 && *n_ctx < static_cast<int64_t>(tok.size()))
      usage_fail("--ctx-size {} is smaller than the {} ids", *n_ctx, tok.size());
    o->n_ctx = *n_ctx > 0 ? *n_ctx : static_cast<int64_t>(tok.size());
    if (*n_ctx == 0) {  // the context is the ids': say so when that is more than the model takes
      const Hparams hp = read_hparams(open_model(o->model_path, /*with_data=*/false));
      if (hp.n_ctx_train > 0 && o->n_ctx > hp.n_ctx_train)
        fail("{} ids are more than the model's training context {} (without -c the context is the number of ids)",
             tok.size(), hp.n_ctx_train);
    }
    Session s(*o);
    std::vector<float> logits = s.eval(tok);
    int64_t n_vocab = s.hparams.n_vocab;
    // As run: a NaN or infinite logit is an error (exit 1), not a null in the JSON and an argmax of -1.
    for (size_t r = 0; r < tok.size(); ++r)
      check_finite_logits(
          std::span<const float>(logits.data() + r * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab)),
          fmt::format("position {} (id {})", r, tok[r]));
    nlohmann::ordered_json j;
    j["ids"] = tok;
    std::vector<int32_t> am;
    for (size_t r = 0; r < tok.size(); ++r)
      am.push_back(argmax(std::span<const float>(logits.data() + r * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab))));
    j["argmax_all"] = am;
    j["logits_last"] = std::vector<float>(logits.end() - n_vocab, logits.end());
    j["backend"] = s.backend->name();
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());  // never throws on text
  });
}

}  // namespace mk::cli
