// `tokenize`: text -> token ids with the model's vocabulary only (no weights are read), like
// llama.cpp's llama-tokenize.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "support/error.h"
#include "support/text_file.h"

namespace mk::cli {

void add_tokenize_command(CLI::App& app) {
  struct Opts {
    std::string model, prompt, file;
    bool no_bos = false, parse_special = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize", "print the token ids of a text (reads only the model's vocabulary)");
  cmd->add_option("-m,--model", o->model, "GGUF file (a vocab-only file works) or HF directory")->required();
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "text to tokenize");
  auto* f = cmd->add_option("-f,--file", o->file, "read the text from this file");
  p->excludes(f);
  cmd->add_flag("--no-bos", o->no_bos, "do not add the vocabulary's BOS/EOS tokens");
  cmd->add_flag("--parse-special", o->parse_special, "control tokens written in the text (<|im_start|>) become their ids");
  cmd->add_flag("--json", o->json, "print {\"ids\": [...], \"pieces\": [...]}");
  cmd->callback([o, p, f] {
    if (o->model.rfind("synth:", 0) == 0)  // random weights only: there is no vocabulary to read
      fail("{}: synthetic models carry no tokenizer; tokenize needs a GGUF file or an HF directory", o->model);
    if (p->count() == 0 && f->count() == 0) usage_error("tokenize: give the text with -p TEXT or -f FILE");
    std::string text = o->prompt;
    if (f->count()) {
      text = read_text_file(o->file);
    }
    ModelFile m = load_model_vocab(o->model);
    auto tok = load_model_tokenizer(m);
    const std::vector<int32_t> ids = tok->encode(text, !o->no_bos, o->parse_special);
    if (o->json) {
      nlohmann::json j;
      j["ids"] = ids;
      nlohmann::json pieces = nlohmann::json::array();
      for (int32_t id : ids) pieces.push_back(tok->token_text(id));
      j["pieces"] = std::move(pieces);
      // A piece can be part of a UTF-8 character (a byte token): such bytes print as U+FFFD.
      std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      return;
    }
    for (int32_t id : ids) {
      nlohmann::json piece = tok->token_text(id);
      std::printf("%6d -> %s\n", id, piece.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
  });
}

}  // namespace mk::cli
