#include <algorithm>
#include <charconv>
#include <cfloat>
#include <cmath>
#include <fmt/format.h>
#include <limits>

#include "backend/backend.h"
#include "cli/commands.h"
#include "isa/program.h"
#include "support/error.h"

namespace mk::cli {

namespace {

// "-5" with lo >= 0, "99999999999999999999", "3000000000" into an int: all are range errors, not
// "not a number". An explicit upper bound says "lo to hi"; the implicit one (the target's limit)
// says "lo or more" below and "at most hi" above.
std::string range_error(const std::string& s, int64_t lo, int64_t hi, bool implicit_hi, bool below) {
  if (!implicit_hi) return fmt::format("{} is out of range: it must be {} to {}", s, lo, hi);
  return below ? fmt::format("{} is out of range: it must be {} or more", s, lo)
               : fmt::format("{} is out of range: it must be at most {}", s, hi);
}

// "+5" is 5, as strtod, Python and most CLIs read it (std::from_chars refuses a '+'); the sign is
// dropped from the text CLI11 then converts.
void drop_plus_sign(std::string& s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '+' && s[1] != '-') s.erase(0, 1);
}

CLI::Validator integer_validator(int64_t lo, int64_t hi, bool implicit_hi) {
  const std::string desc = implicit_hi ? fmt::format("INT>={}", lo) : fmt::format("INT in [{} - {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, implicit_hi](std::string& s) -> std::string {
        drop_plus_sign(s);
        int64_t v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec == std::errc::invalid_argument || p != s.data() + s.size())
          return fmt::format("'{}' is not a whole number", s);
        if (ec == std::errc::result_out_of_range) return range_error(s, lo, hi, implicit_hi, s[0] == '-');
        if (v < lo || v > hi) return range_error(s, lo, hi, implicit_hi, v < lo);
        // CLI11 converts the text again with strtoll base 0: "010" would be octal 8 and "08" "Could
        // not convert" (new-user trial 36). The value checked here, in decimal, is what it converts.
        s = std::to_string(v);
        return {};
      },
      desc);
}

}  // namespace

CLI::Validator integer_range(int64_t lo, int64_t hi) { return integer_validator(lo, hi, false); }

CLI::Validator integer_at_least(int64_t lo, int64_t hi) { return integer_validator(lo, hi, true); }

CLI::Validator unsigned_integer() {
  const uint64_t hi = std::numeric_limits<uint64_t>::max();
  return CLI::Validator(
      [hi](std::string& s) -> std::string {
        drop_plus_sign(s);
        const bool negative = !s.empty() && s[0] == '-';
        uint64_t v = 0;
        const char* first = s.data() + (negative ? 1 : 0);
        auto [p, ec] = std::from_chars(first, s.data() + s.size(), v);
        if (s.size() == (negative ? 1u : 0u) || ec == std::errc::invalid_argument || p != s.data() + s.size())
          return fmt::format("'{}' is not a whole number", s);
        if (negative || ec == std::errc::result_out_of_range)
          return fmt::format("{} is out of range: it must be 0 to {}", s, hi);
        s = std::to_string(v);  // decimal, as checked (CLI11 would read "010" as octal)
        return {};
      },
      fmt::format("UINT in [0 - {}]", hi));
}

CLI::Validator backend_name() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::vector<std::string> names = backend_names();
        if (std::find(names.begin(), names.end(), s) != names.end()) return {};
        return fmt::format("unknown backend '{}'; available: {}", s, fmt::join(names, ", "));
      },
      "BACKEND");
}

CLI::Validator schedule_name() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          (void)schedule_from_name(s);
          return {};
        } catch (const Error& e) {
          return e.what();
        }
      },
      "SCHEDULE");
}

CLI::Validator number_range(double lo, double hi, bool above_lo, bool as_float) {
  const bool open = std::isinf(hi);
  const std::string desc = open ? fmt::format("NUMBER{}{}", above_lo ? ">" : ">=", lo)
                                : fmt::format("NUMBER in {}{} - {}]", above_lo ? "(" : "[", lo, hi);
  // What the value must be, e.g. "more than 0 and at most 1", "0 or more (a finite number)".
  const std::string range = above_lo ? (open ? fmt::format("more than {} (a finite number)", lo)
                                             : fmt::format("more than {} and at most {}", lo, hi))
                            : open   ? fmt::format("{} or more (a finite number)", lo)
                                     : fmt::format("{} to {}", lo, hi);
  return CLI::Validator(
      [lo, hi, above_lo, as_float, range, open](std::string& s) -> std::string {
        drop_plus_sign(s);
        double v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec == std::errc::invalid_argument || p != s.data() + s.size() || std::isnan(v))
          return fmt::format("'{}' is not a number", s);
        if (ec == std::errc::result_out_of_range || std::isinf(v) || v < lo || v > hi || (above_lo && v == lo))
          return fmt::format("{} is out of range: it must be {}", s, range);
        // The option is stored as a float: a value in range as a double may round out of it
        // (1e-300 to 0, 1e39 to infinity); check what the program will use.
        if (const float f = static_cast<float>(v);
            as_float && (std::isinf(f) || f < lo || f > hi || (above_lo && f == static_cast<float>(lo))))
          return fmt::format("{} rounds to {} as a 32-bit float, which is out of range: it must be {}", s, f,
                             open ? fmt::format("{}{}{} (at most {:g})", above_lo ? "more than " : "", lo, above_lo ? "" : " or more", double{FLT_MAX})
                                  : range);
        return {};
      },
      desc);
}

void refuse_threads_for_reference(CLI::App* cmd, const std::string& backend, const int& threads) {
  cmd->parse_complete_callback([&backend, &threads] {
    if (backend == "reference" && threads > 0)
      usage_fail("-t {}: the reference backend runs op by op on one thread; -t sets the workers of the cpu backend (and the "
           "blocks of cuda and cuda-emu)",
           threads);
  });
}

void add_generation_options(CLI::App* cmd, SessionOptions& session, SamplerOptions& sampler) {
  cmd->add_option("--temp", sampler.temperature, "sampling temperature (0 = greedy)")->capture_default_str()->transform(number_range(0, HUGE_VAL, false, /*as_float=*/true));
  cmd->add_option("--top-k", sampler.top_k, "top-k sampling (0 = off)")->capture_default_str()->transform(integer_at_least(0));
  cmd->add_option("--top-p", sampler.top_p, "top-p (nucleus) sampling (1 = off)")->capture_default_str()->transform(number_range(0, 1, /*above_lo=*/true, /*as_float=*/true));
  cmd->add_option("--seed", sampler.seed, "random seed")->capture_default_str()->transform(unsigned_integer());
  cmd->add_option("--min-p", sampler.min_p, "min-p sampling: keep tokens at least this fraction as likely as the best (0 = off)")
      ->capture_default_str()->transform(number_range(0, 1, false, /*as_float=*/true));
  cmd->add_option("--repeat-penalty", sampler.repeat_penalty,
                  "llama.cpp's repeat penalty on the tokens of the last --repeat-last-n (1 = off)")
      ->capture_default_str()->transform(number_range(0, 1e6, /*above_lo=*/true, /*as_float=*/true));
  cmd->add_option("--presence-penalty", sampler.presence_penalty, "OpenAI's presence penalty, -2 to 2 (0 = off)")
      ->capture_default_str()->transform(number_range(-2, 2, false, /*as_float=*/true));
  cmd->add_option("--frequency-penalty", sampler.frequency_penalty, "OpenAI's frequency penalty, -2 to 2 (0 = off)")
      ->capture_default_str()->transform(number_range(-2, 2, false, /*as_float=*/true));
  cmd->add_option("--repeat-last-n", sampler.penalty_last_n,
                  "the penalties' window: the last N tokens, prompt included (-1 = all, 0 = penalties off)")
      ->capture_default_str()->transform(integer_range(-1, INT32_MAX));
  // llama.cpp's syntax: TOKEN_ID followed by a signed bias (15043+1, 15043-1.5).
  cmd->add_option_function<std::vector<std::string>>(
         "-l,--logit-bias",
         [&sampler](const std::vector<std::string>& items) {
           for (const std::string& item : items) {
             const size_t at = item.find_first_of("+-", 1);
             int64_t id = -1;
             double bias = 0;
             const char* b = item.data();
             const char* e = item.data() + item.size();
             auto [id_end, id_ec] = std::from_chars(b, at == std::string::npos ? e : b + at, id);
             const char* bias_start = at == std::string::npos ? e : b + at + (item[at] == '+' ? 1 : 0);
             auto [bias_end, bias_ec] = std::from_chars(bias_start, e, bias);
             if (at == std::string::npos || id_ec != std::errc() || id_end != b + at || bias_ec != std::errc() ||
                 bias_end != e || (item[at] == '+' && bias_start < e && (*bias_start == '-' || *bias_start == '+')))
               throw CLI::ValidationError("--logit-bias", fmt::format("'{}' is not TOKEN_ID followed by a signed bias (15043+1, 15043-1.5)", item));
             if (id < 0 || id > INT32_MAX) throw CLI::ValidationError("--logit-bias", fmt::format("token id {} is out of range", id));
             if (!(bias >= -100 && bias <= 100))
               throw CLI::ValidationError("--logit-bias", fmt::format("the bias of token {} must be between -100 and 100, got {}", id, bias));
             sampler.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
           }
         },
         "add a bias to a token's logit before sampling, as llama.cpp's -l: TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-100 "
         "(bias -100 to 100; repeat for more tokens)")
      ->type_name("ID(+/-)BIAS")
      ->allow_extra_args(false);
  cmd->add_option("-c,--ctx-size", session.n_ctx, "context length (0 = the model's, at most 4096)")
      ->transform(integer_at_least(0));
  cmd->add_option("--backend", session.backend, "backend: reference, cpu, ... (default: the fastest available)")
      ->check(backend_name());
  refuse_threads_for_reference(cmd, session.backend, session.backend_options.threads);
  cmd->add_option("-t,--threads", session.backend_options.threads, "workers: cpu threads (0 = all cores, at most 1024); cuda and cuda-emu blocks (0 = one per SM; cuda-emu 4)")
      ->transform(integer_range(0, 1024));
  cmd->add_option("--act-quant", session.backend_options.act_quant,
                  "cpu: quantize matmul activations to 8-bit blocks as llama.cpp does: auto (on for GGUF files and synth: models with "
                  "block-quantized weights), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--kv-type", session.backend_options.kv_type,
                  "cpu: KV cache precision as llama.cpp's: f16, f32, or auto (f16 for GGUF files and synth: models with block-quantized "
                  "weights, else f32)")
      ->check(CLI::IsMember({"auto", "f16", "f32"}));
}

}  // namespace mk::cli
