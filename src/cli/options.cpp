#include <charconv>
#include <fmt/format.h>

#include "cli/commands.h"

namespace mk::cli {

CLI::Validator integer_range(int64_t lo, int64_t hi) {
  const std::string desc = hi == INT64_MAX ? fmt::format("INT>={}", lo) : fmt::format("INT in [{} - {}]", lo, hi);
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec == std::errc::invalid_argument || p != s.data() + s.size())
          return fmt::format("'{}' is not a whole number", s);
        if (ec == std::errc::result_out_of_range || v < lo || v > hi)
          return hi == INT64_MAX ? fmt::format("{} is out of range: it must be {} or more", s, lo)
                                 : fmt::format("{} is out of range: it must be {} to {}", s, lo, hi);
        return {};
      },
      desc);
}

CLI::Validator integer_at_least(int64_t lo) { return integer_range(lo, INT64_MAX); }

}  // namespace mk::cli
