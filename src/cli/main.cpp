// megakernel: compile a language model into one persistent kernel and run it.
#include <algorithm>
#include <cstdio>
#include <regex>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "support/error.h"
#include "support/printable.h"

namespace {

// CLI11's message, or a plainer one where it names no cause: an unknown or missing command (CLI11:
// "A subcommand is required") lists the commands; an option given twice (CLI11: "--temp: At Most 1
// required but received 2") says so. Every option takes one value: a repeat is an error rather than
// "the last wins", so a script that sets an option twice learns of it. An option without its value
// says so (CLI11: "--n-predict: 1 required INT:INT>=0 missing").
std::string parse_error_message(const CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  std::string msg = e.what();
  if (app.get_subcommands().empty()) {
    std::string commands;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      commands += (commands.empty() ? "" : ", ") + sub->get_name();
    for (int i = 1; i < argc; ++i)
      if (argv[i][0] != '-')
        return fmt::format("unknown command '{}'; the commands are: {}", mk::printable(argv[i]), commands);
    if (e.get_name() == "RequiredError") {
      // `megakernel -v`: the option is named (before a command only --help and --version are taken)
      if (argc > 1) return fmt::format("unknown option '{}' (before a command only --help and --version); a command is "
                                       "required: {}", mk::printable(argv[1]), commands);
      return fmt::format("a command is required: {}", commands);
    }
    return msg;
  }
  // Arguments the command does not know come first (CLI11 checks required options before them, and
  // lists them last to first): "unknown option '--tmp'" rather than "--model is required".
  std::vector<std::string> extra = app.get_subcommands().front()->remaining();
  if (!extra.empty()) {
    auto at = [&](const std::string& a) {
      for (int i = 1; i < argc; ++i)
        if (a == argv[i]) return i;
      return argc;
    };
    std::stable_sort(extra.begin(), extra.end(), [&](const std::string& a, const std::string& b) { return at(a) < at(b); });
    std::string list;
    for (const std::string& a : extra) list += (list.empty() ? "'" : ", '") + mk::printable(a) + "'";
    if (extra.front().size() > 1 && extra.front()[0] == '-')
      return fmt::format("unknown option '{}' for '{}'{}", mk::printable(extra.front()),
                         app.get_subcommands().front()->get_name(), extra.size() > 1 ? " (unexpected: " + list + ")" : "");
    return fmt::format("unexpected argument{}: {}", extra.size() > 1 ? "s" : "", list);
  }
  static const std::regex kRepeated("(.*): At Most 1 required but received ([0-9]+)");
  if (std::smatch m; std::regex_match(msg, m, kRepeated))
    return fmt::format("{} was given {} times; give it once", m[1].str(), m[2].str());
  // An option at the end of the line without its value (CLI11: "--n-predict: 1 required INT:INT>=0 missing").
  static const std::regex kNoValue("(-[^:]*): 1 required .* missing");
  if (std::smatch m; std::regex_match(msg, m, kNoValue)) return fmt::format("{} needs a value", m[1].str());
  return msg;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"megakernel: compiles a language model into one persistent GPU kernel (CPU interpreter included)"};
  app.set_version_flag("--version", MK_VERSION_TEXT);
  app.require_subcommand(1);
  mk::cli::add_run_command(app);
  mk::cli::add_info_command(app);
  mk::cli::add_logits_command(app);
  mk::cli::add_embed_command(app);
  mk::cli::add_compile_command(app);
  mk::cli::add_bench_copy_command(app);
  mk::cli::add_tokenize_command(app);
  mk::cli::add_chat_command(app);
  mk::cli::add_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see --help)\n", parse_error_message(app, argc, argv, e).c_str());
    return 2;
  } catch (const mk::UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const mk::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "error: writing the output failed\n");
    return 1;
  }
  return 0;
}
