#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "runtime/embed.h"
#include "runtime/session.h"
#include "support/error.h"
#include "support/text_file.h"

namespace mk::cli {

void add_embed_command(CLI::App& app) {
  struct Opts {
    SessionOptions session;
    std::vector<std::string> prompts;
    std::string file, ids, pooling;
    bool no_normalize = false;
    int64_t dimensions = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("embed", "print the embedding of each text (the last hidden state, pooled) as JSON");
  cmd->add_option("-m,--model", o->session.model_path, "model: GGUF file, llama2.c .bin, HF directory, synth:<name>")->required();
  cmd->add_option("-z,--tokenizer", o->session.tokenizer_path, "tokenizer file (llama2.c tokenizer.bin, or an HF tokenizer.json)");
  auto* prompt = cmd->add_option("-p,--prompt", o->prompts, "a text to embed (repeat for more; BOS/EOS as the vocabulary adds them)");
  auto* file = cmd->add_option("-f,--file", o->file, "embed each non-empty line of this file (- = standard input)")->excludes(prompt);
  cmd->add_option("--ids", o->ids, "one input as comma-separated token ids (nothing added); works without a tokenizer")
      ->excludes(prompt)
      ->excludes(file)
      ->check(token_ids());
  cmd->add_option("--pooling", o->pooling,
                  "none (every token's vector), mean, cls (the first token's) or last (the last token's); default: the model's "
                  "(GGUF pooling_type, sentence-transformers' 1_Pooling), else mean")
      ->check(CLI::IsMember({"none", "mean", "cls", "last"}));
  cmd->add_flag("--no-normalize", o->no_normalize, "keep the vectors as they are (default: divided by their L2 norm)");
  cmd->add_option("--dimensions", o->dimensions,
                  "keep the first N values of each vector, before normalizing (OpenAI's shortened embeddings; 0 = all)")
      ->transform(integer_at_least(0, INT64_MAX));
  cmd->add_option("-c,--ctx-size", o->session.n_ctx, "context length: the longest input (0 = the model's, at most 4096)")
      ->transform(integer_at_least(0));
  cmd->add_option("--backend", o->session.backend, "backend: cpu, cuda, ... (default: the fastest available)")->check(backend_name());
  refuse_threads_for_reference(cmd, o->session.backend, o->session.backend_options.threads);
  cmd->add_option("-t,--threads", o->session.backend_options.threads,
                  "workers: cpu threads (0 = all cores, at most 1024); cuda and cuda-emu blocks (0 = one per SM; cuda-emu 4)")
      ->transform(integer_range(0, 1024));
  cmd->add_option("--act-quant", o->session.backend_options.act_quant,
                  "cpu: quantize matmul activations to 8-bit blocks as llama.cpp does: auto, on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--kv-type", o->session.backend_options.kv_type, "cpu: KV cache precision: auto, f16, f32")
      ->check(CLI::IsMember({"auto", "f16", "f32"}));
  cmd->callback([o, prompt, file] {
    if (o->prompts.empty() && o->file.empty() && o->ids.empty()) usage_error("embed needs its input: -p TEXT, -f FILE or --ids ID,...");
    std::vector<std::string> texts = o->prompts;
    std::vector<std::string> labels;  // what errors call each input: "-p 2", "FILE line 7"
    for (size_t k = 0; k < texts.size(); ++k) labels.push_back(texts.size() == 1 ? "-p" : fmt::format("-p #{}", k + 1));
    if (file->count() > 0) {
      const std::string text = read_text_file(o->file);
      size_t line_no = 0;
      for (size_t at = 0; at <= text.size();) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(at, end - at);
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) {
          texts.push_back(std::move(line));
          labels.push_back(fmt::format("{} line {}", text_file_name(o->file), line_no));
        }
        at = end + 1;
      }
      if (texts.empty()) fail("{}: no non-empty line to embed", text_file_name(o->file));
    }
    o->session.embeddings = true;
    if (!o->ids.empty()) {
      o->session.need_tokenizer = false;
      o->session.tokenizer_if_available = false;
    }
    Session s(o->session);
    EmbedOptions eo;
    eo.pooling = o->pooling.empty() ? model_pooling(s.model) : pooling_from_name(o->pooling);
    eo.normalize = !o->no_normalize;
    if (o->dimensions > s.hparams.n_embd)
      usage_error(fmt::format("--dimensions {} is more than the model's {} (n_embd)", o->dimensions, s.hparams.n_embd));
    eo.dimensions = o->dimensions;
    std::vector<std::vector<int32_t>> inputs;
    if (!o->ids.empty()) {
      inputs.push_back(parse_ids(o->ids));
      labels = {"--ids"};
    } else {
      for (size_t i = 0; i < texts.size(); ++i) {
        if (texts[i].empty()) usage_error(fmt::format("{}: the text is empty", labels[i]));  // as serve's 400 (a BOS alone is no text's vector)
        try {
          inputs.push_back(s.tokenizer->encode(texts[i], /*add_bos=*/true));
        } catch (const Error& e) {
          fail("{}: {}", labels[i], e.what());
        }
        if (inputs.back().empty()) fail("{}: the text gives no tokens to embed", labels[i]);
      }
    }
    for (size_t i = 0; i < inputs.size(); ++i)  // named as the user gave them (embed() counts inputs from 0)
      if (static_cast<int64_t>(inputs[i].size()) > s.n_ctx)
        fail("{}: {} tokens are more than the context length {} (-c)", labels[i], inputs[i].size(), s.n_ctx);
    const int64_t n_embd = s.hparams.n_embd, d = o->dimensions > 0 ? o->dimensions : n_embd;
    const std::vector<std::vector<float>> vectors = embed(*s.backend, n_embd, s.n_ctx, s.hparams.n_vocab, inputs, eo);
    s.backend->finish();
    nlohmann::ordered_json j;
    j["backend"] = s.backend->name();
    j["pooling"] = pooling_name(eo.pooling);
    j["normalized"] = eo.normalize;
    j["dimensions"] = d;
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (size_t i = 0; i < vectors.size(); ++i) {
      nlohmann::ordered_json e = {{"index", i}, {"n_tokens", inputs[i].size()}};
      if (eo.pooling == Pooling::none) {
        nlohmann::ordered_json rows = nlohmann::ordered_json::array();
        for (size_t at = 0; at < vectors[i].size(); at += static_cast<size_t>(d))
          rows.push_back(std::vector<float>(vectors[i].begin() + static_cast<std::ptrdiff_t>(at),
                                            vectors[i].begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(d))));
        e["embedding"] = std::move(rows);
      } else {
        e["embedding"] = vectors[i];
      }
      data.push_back(std::move(e));
    }
    j["data"] = std::move(data);
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  });
}

}  // namespace mk::cli
