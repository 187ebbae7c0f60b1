// JSON Schema's `pattern` (and the string `format`s given as patterns) for constrained decoding: an
// ECMA-262 regular expression (the dialect JSON Schema 2020-12 names, section 6.4) compiled to a
// position automaton over Unicode code points, stepped one character at a time.
//
// Supported: literals, `.`, classes `[a-z_]` / `[^...]`, the escapes \d \w \s \D \W \S \t \n \r \f \v
// \0 \xHH \uHHHH and escaped punctuation, groups `(...)` / `(?:...)` / `(?<name>...)`, `|`, the
// quantifiers * + ? {n} {n,} {n,m} (lazy forms alike: the same language), and `^` / `$` at the
// ends of the pattern or of its top-level alternatives. A pattern is a search, as JSON Schema's: an
// end without its anchor matches anything there. Back-references, lookaround, word boundaries and
// flags are refused (mk::Error naming the construct and its offset), as are patterns of more than
// kMaxStates character positions (counted repetitions are unrolled).
//
// A state is a set of positions (a bitset of kMaxStates bits). Positions that cannot reach the end
// of a match are dropped at compile time, so a non-empty state can always be finished; so are the
// characters a JSON string with a pattern cannot hold (control characters other than \b \t \n \f \r,
// which need a \u escape).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mk {

class StringPattern {
 public:
  static constexpr int kMaxStates = 255;  // character positions; bit kMaxStates is the match end
  using Set = std::array<uint64_t, 4>;
  static constexpr int32_t kUnbounded = INT32_MAX;

  // Throws mk::Error naming what is malformed or not supported (`what` names the pattern in it).
  static StringPattern compile(std::string_view pattern, const std::string& what);
  // The anchored patterns of the string formats enforced ("date", "time", "date-time", "uuid",
  // "email", "ipv4"); empty for another format.
  static std::string_view format_pattern(std::string_view format);

  const Set& start() const { return start_; }
  // The state after a character c (code point) in any of [lo, hi]: the union of the positions each
  // such character leads to (empty: none continues).
  Set step(const Set& s, uint32_t lo, uint32_t hi) const;
  bool accepts(const Set& s) const { return (s[kMaxStates / 64] >> (kMaxStates % 64)) & 1; }
  static bool empty(const Set& s) { return (s[0] | s[1] | s[2] | s[3]) == 0; }
  // Whether a whole string (UTF-8) matches.
  bool matches(std::string_view text) const;
  // Fewest / most characters from s to a match end (kUnbounded: no most).
  int32_t min_rest(const Set& s) const;
  int32_t max_rest(const Set& s) const;

 private:
  struct Position {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // the characters it takes, sorted, disjoint
    Set follow{};                                       // the positions after it
    int32_t min_rest = 0, max_rest = 0;                 // characters to a match end, this one included
  };
  std::vector<Position> pos_;
  Set start_{};
  friend class PatternCompiler;
};

}  // namespace mk
