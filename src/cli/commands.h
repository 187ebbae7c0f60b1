// One function per subcommand; main.cpp lists them. Commands only parse flags and call the library.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace mk::cli {

void add_run_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_embed_command(CLI::App& app);
void add_compile_command(CLI::App& app);
void add_bench_copy_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_serve_command(CLI::App& app);

// Validators for integer options, replacing CLI11's Range/NonNegativeNumber (which call "abc" out of
// range and print the double limits): "'abc' is not a whole number", "-1 is out of range: it must be 0
// or more" (CLI11 puts the option's name first).
// integer_at_least's upper bound is the target's own limit (default: an int's), so a value the
// option cannot hold is "out of range: it must be at most 2147483647", not CLI11's "Could not convert".
// Attach these numeric validators with ->transform(), not ->check(): they write the checked value
// back in plain decimal ("+5" -> "5", "010" -> "10"), which CLI11 (strtoll base 0) would otherwise
// read as octal; ->check() discards the rewrite.
CLI::Validator integer_range(int64_t lo, int64_t hi);
CLI::Validator integer_at_least(int64_t lo, int64_t hi = INT32_MAX);
// A uint64 option (--seed): 0 to 2^64-1; "-1" and "2^64" are out of range, not wrapped.
CLI::Validator unsigned_integer();
// A finite decimal number in [lo, hi] ((lo, hi] with above_lo; hi may be infinity: no upper bound);
// "nan", "inf", "abc" are refused. as_float: the option is a float, and the value rounded to float
// must be in range too (--top-p 1e-300 would become 0), else the error names the user's value.
CLI::Validator number_range(double lo, double hi, bool above_lo = false, bool as_float = false);

// A --backend value: one of backend_names() ("unknown backend 'x'; available: ..." as a usage
// error, exit 2, before any model is read).
CLI::Validator backend_name();
// --schedule: dynamic, static-rr or static-cp (a usage error, exit 2, like an unknown backend).
CLI::Validator schedule_name();

// The flags `run` and `chat` share: sampling (--temp, --top-k, --top-p, --seed) into `sampler`, the
// context and the backend (-c, --backend, -t, --act-quant, --kv-type) into `session`.
void add_generation_options(CLI::App* cmd, SessionOptions& session, SamplerOptions& sampler);

// -t given with --backend reference (the oracle runs op by op on one thread) is an error (exit 1) once
// the command line is parsed, as that backend's other refusals (--schedule, --attn-splits), instead
// of being accepted and ignored. The library takes any count (tests pass one to every backend).
void refuse_threads_for_reference(CLI::App* cmd, const std::string& backend, const int& threads);

// "1,2,3" -> {1, 2, 3}; throws mk::Error naming `flag` for an empty list or a non-integer entry.
std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag = "--ids");
// What is wrong with s as a comma-separated list of token ids ("" when nothing), and the option
// check that makes it a usage error (exit 2) before anything loads.
std::string token_ids_problem(const std::string& s);
CLI::Validator token_ids();
// A usage error found in a command's callback (options that need or exclude each other beyond what
// CLI11 states): "error: MSG (see --help)", exit status 2, as CLI11's own.
[[noreturn]] inline void usage_error(const std::string& msg) { throw CLI::ValidationError(msg); }

// Generated text streamed to stdout as it comes. end_line() ends a line left open, so that an error
// printed to stderr after a failed step starts a line of its own on a terminal.
class StreamOut {
 public:
  void put(const std::string& t) {
    std::fputs(t.c_str(), stdout);
    std::fflush(stdout);
    if (!t.empty()) open_ = t.back() != '\n';
  }
  void end_line() {
    if (open_) std::fputs("\n", stdout);
    std::fflush(stdout);
    open_ = false;
  }

 private:
  bool open_ = false;
};

}  // namespace mk::cli
