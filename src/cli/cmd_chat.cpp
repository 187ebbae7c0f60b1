// `chat`: an interactive, multi-turn conversation with the model's chat template; replies stream.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <csignal>

#include <unistd.h>

#include "cli/commands.h"
#include "runtime/chat.h"
#include "runtime/session.h"
#include "support/error.h"
#include "support/printable.h"
#include "support/text_file.h"

namespace mk::cli {
namespace {

// Ctrl-C during a reply ends the reply (the conversation goes on, as llama.cpp's interactive mode);
// at the "> " prompt it ends the program as usual. A lock-free atomic store is async-signal-safe.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

// Installs on_sigint for its lifetime, then puts the previous action back.
class ReplyInterrupt {
 public:
  ReplyInterrupt() {
    g_interrupted.store(false);
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;  // writes and waits in flight go on
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~ReplyInterrupt() { sigaction(SIGINT, &old_, nullptr); }
  ReplyInterrupt(const ReplyInterrupt&) = delete;
  ReplyInterrupt& operator=(const ReplyInterrupt&) = delete;

 private:
  struct sigaction old_ {};
};

}  // namespace

void add_chat_command(CLI::App& app) {
  struct Opts {
    SessionOptions session;
    GenerateOptions gen;
    std::string system, template_file;
  };
  auto o = std::make_shared<Opts>();
  o->gen.n_new = 1024;
  auto* cmd = app.add_subcommand("chat", "talk with the model: one line per user turn, /reset starts a new conversation, /exit (or end of input) ends; a line starting with // sends one starting with /");
  cmd->add_option("-m,--model", o->session.model_path, "model: GGUF file or HF directory with a chat template")->required();
  cmd->add_option("-z,--tokenizer", o->session.tokenizer_path, "tokenizer file (llama2.c tokenizer.bin, or an HF tokenizer.json)");
  auto* system = cmd->add_option("--system", o->system, "system message at the start of the conversation (\"\" = an empty one)");
  cmd->add_option("--chat-template-file", o->template_file, "Jinja2 template to use instead of the model's");
  cmd->add_option("-n,--n-predict", o->gen.n_new, "at most this many tokens per reply")->capture_default_str()->transform(integer_at_least(0));
  add_generation_options(cmd, o->session, o->gen.sampler);
  cmd->add_option("--draft", o->gen.draft,
                  "prompt lookup decoding (as run's): draft up to N tokens from the turn so far, "
                  "the same tokens as without, sampled ones for a seed too (0 = off)")
      ->transform(integer_range(0, 255));
  cmd->callback([o, system] {
    Session s(o->session);
    if (const std::string why = draft_unused_reason(s, o->gen); !why.empty())
      std::fprintf(stderr, "note: --draft is off: %s\n", why.c_str());
    try {  // ids past the vocabulary, known once the model is loaded: a usage error as the others
      check_logit_bias(o->gen.sampler, s.hparams.n_vocab);
    } catch (const Error& e) {
      usage_error(fmt::format("--logit-bias: {}", e.what()));
    }
    std::string source;
    if (!o->template_file.empty()) {
      source = read_text_file(o->template_file);
    } else {
      source = model_chat_template(s.model);
    }
    // --system "" is an empty system message (SmolLM2's template writes its own default without one).
    std::optional<ChatConversation> made;
    try {
      made.emplace(s, source, system->count() > 0 ? std::optional<std::string>(o->system) : std::nullopt);
    } catch (const Error& e) {
      if (o->template_file.empty()) throw;
      fail("{} (--chat-template-file {})", e.what(), o->template_file);
    }
    ChatConversation& conv = *made;
    std::string line;
    int failed = 0, turns = 0;
    // The "> " prompt only for a person at a terminal: with piped input it would start the line of
    // every note and error.
    const bool prompt = isatty(STDIN_FILENO) != 0;
    for (;;) {
      if (prompt) {
        std::fputs("> ", stderr);
        std::fflush(stderr);
      }
      if (!std::getline(std::cin, line)) break;
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a Windows line end: "/exit\r" is /exit
      if (line == "/exit" || line == "/quit") break;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // nothing to say
      if (line == "/reset") {
        conv.reset();
        std::fputs("note: new conversation\n", stderr);
        continue;
      }
      // Any other line starting with one '/' is a mistyped command, not a message; "//..." sends "/...".
      if (line[0] == '/' && line.rfind("//", 0) != 0) {
        const std::string word = line.substr(0, line.find_first_of(" \t\r"));
        if (word == "/reset" || word == "/exit" || word == "/quit")
          std::fprintf(stderr, "note: %s takes nothing after it; nothing done\n", word.c_str());
        else
          std::fprintf(stderr, "note: unknown command %s; the commands are /reset and /exit (or /quit); start a message "
                       "with // to send one that begins with /\n", printable(word).c_str());
        continue;
      }
      if (line.rfind("//", 0) == 0) line.erase(0, 1);
      ++turns;
      // A turn that fails (longer than the context, or the conversation no longer fits) is dropped
      // with its error; the conversation goes on, and /reset starts a new one.
      StreamOut out;
      try {
        GenerateResult r;
        {
          ReplyInterrupt ctrl_c;
          GenerateOptions g = o->gen;
          g.interrupt = &g_interrupted;
          conv.on_drop = [&](int64_t n) {  // before the reply
            std::fprintf(stderr, "note: the conversation left no room for a reply in the context (%lld tokens): its %lld oldest message%s dropped\n",
                         static_cast<long long>(s.n_ctx), static_cast<long long>(n), n == 1 ? " was" : "s were");
          };
          r = conv.reply(line, g, [&](const std::string& t) { out.put(t); });
        }
        std::printf("\n");
        std::fflush(stdout);
        if (r.stop_reason == "interrupted")
          std::fputs("note: reply interrupted (Ctrl-C); it stays in the conversation as far as it went\n", stderr);
        if (r.stop_reason == "context")
          std::fprintf(stderr, "note: the context (%lld token%s) is full: the next turn drops the oldest ones; /reset starts a new conversation\n",
                       static_cast<long long>(s.n_ctx), s.n_ctx == 1 ? "" : "s");
      } catch (const Error& e) {
        out.end_line();
        ++failed;
        std::fprintf(stderr, "error: %s (the turn is dropped; /reset starts a new conversation)\n", e.what());
        if (s.backend->stopped()) {  // its cache is lost with the failed step: the conversation cannot go on
          conv.reset();
          std::fputs("note: the backend stopped after a device error; a new conversation starts\n", stderr);
        }
      }
    }
    s.backend->finish();
    if (failed) fail("chat: {} of {} turn{} failed (see above)", failed, turns, turns == 1 ? "" : "s");
  });
}

}  // namespace mk::cli
