// megakernel: compile a language model into one persistent kernel and run it.
#include <cstdio>

#include "cli/commands.h"
#include "support/error.h"

int main(int argc, char** argv) {
  CLI::App app{"megakernel: compiles a language model into one persistent GPU kernel (CPU interpreter included)"};
  app.require_subcommand(1);
  mk::cli::add_run_command(app);
  mk::cli::add_info_command(app);
  mk::cli::add_logits_command(app);
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
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see --help)\n", e.what());
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
