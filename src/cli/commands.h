// One function per subcommand; main.cpp lists them. Commands only parse flags and call the library.
#pragma once
#include <CLI/CLI.hpp>

namespace mk::cli {

void add_run_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_compile_command(CLI::App& app);
void add_bench_copy_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_chat_command(CLI::App& app);

}  // namespace mk::cli
