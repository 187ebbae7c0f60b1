// `tokenize`: text -> token ids with the model's vocabulary only (no weights are read), like
// llama.cpp's llama-tokenize.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "model/utf8.h"
#include "support/error.h"
#include "support/text_file.h"

namespace mk::cli {
namespace {

// A piece for the terminal: JSON string quoting for the UTF-8 text, and \xNN for each byte that is
// not part of a complete UTF-8 sequence (a byte token such as <0xE6>, or a piece holding part of a
// character), so that the bytes of every token can be read off ("\xe6\x97" then "\xa5").
std::string shown_piece(const std::string& piece) {
  std::string out = "\"";
  size_t i = 0;
  while (i < piece.size()) {
    size_t j = i;
    while (j < piece.size()) {
      const utf8::SequenceScan sc = utf8::scan_sequence(piece, j);
      if (!sc.complete) break;
      j += sc.length;
    }
    if (j > i) {
      const std::string quoted = nlohmann::json(piece.substr(i, j - i)).dump();
      // JSON escapes the C0 controls; DEL (0x7f) is escaped the same way, or its piece looks empty
      for (size_t k = 1; k + 1 < quoted.size(); ++k) {
        if (quoted[k] == '\x7f') out += "\\u007f";
        else out += quoted[k];
      }
      i = j;
      continue;
    }
    const utf8::SequenceScan sc = utf8::scan_sequence(piece, i);
    for (size_t k = 0; k < sc.length; ++k)
      out += fmt::format("\\x{:02x}", static_cast<uint8_t>(piece[i + k]));
    i += sc.length;
  }
  return out + "\"";
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  struct Opts {
    std::string model, prompt, file;
    bool no_bos = false, parse_special = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize", "print the token ids of a text (reads only the model's vocabulary)");
  cmd->add_option("-m,--model", o->model, "GGUF file (a vocab-only file works) or HF directory")->required();
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "text to tokenize");
  auto* f = cmd->add_option("-f,--file", o->file, "read the text from this file (- = standard input)");
  p->excludes(f);
  cmd->add_flag("--no-bos", o->no_bos, "do not add the vocabulary's BOS/EOS tokens");
  cmd->add_flag("--parse-special", o->parse_special, "control tokens written in the text (<|im_start|>) become their ids");
  cmd->add_flag("--json", o->json,
                "print {\"ids\": [...], \"pieces\": [...], \"piece_bytes\": [[...], ...]} (pieces with U+FFFD for bytes "
                "that are not whole UTF-8 characters; piece_bytes: each piece's bytes)");
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
      // {"ids": [...], "piece_bytes": [[...], ...], "pieces": [...]} written as it goes (a tree of
      // nlohmann values took ~120 bytes per input byte: 2.4 GB for a 20 MB file, new-user trial 48).
      // A piece can be part of a UTF-8 character (a byte token): in "pieces" such bytes are U+FFFD.
      std::string out = "{\"ids\":[";
      for (size_t i = 0; i < ids.size(); ++i) out += fmt::format("{}{}", i ? "," : "", ids[i]);
      out += "],\"piece_bytes\":[";
      for (size_t i = 0; i < ids.size(); ++i) {
        out += i ? ",[" : "[";
        const std::string piece = tok->token_text(ids[i]);
        for (size_t k = 0; k < piece.size(); ++k) out += fmt::format("{}{}", k ? "," : "", static_cast<uint8_t>(piece[k]));
        out += "]";
        if (out.size() > (1 << 20)) std::fputs(out.c_str(), stdout), out.clear();
      }
      out += "],\"pieces\":[";
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ",";
        out += nlohmann::json(tok->token_text(ids[i])).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        if (out.size() > (1 << 20)) std::fputs(out.c_str(), stdout), out.clear();
      }
      out += "]}";
      std::puts(out.c_str());
      return;
    }
    for (int32_t id : ids) std::printf("%6d -> %s\n", id, shown_piece(tok->token_text(id)).c_str());
  });
}

}  // namespace mk::cli
