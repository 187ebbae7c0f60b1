#include "runtime/string_pattern.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "support/error.h"

namespace mk {

namespace {
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCode = 0x10FFFF;

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCode) out.emplace_back(next, kMaxCode);
  return out;
}

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  for (const auto& [l1, h1] : a)
    for (const auto& [l2, h2] : b)
      if (std::max(l1, l2) <= std::min(h1, h2)) out.emplace_back(std::max(l1, l2), std::min(h1, h2));
  return normalized(out);
}

// The characters a string with a pattern can hold: control characters only through the short
// escapes \b \t \n \f \r (\u escapes are not taken there).
// Surrogates (U+D800..DFFF) are no characters: UTF-8 cannot write them.
const Ranges kWritable = {{0x08, 0x0A}, {0x0C, 0x0D}, {0x20, 0xD7FF}, {0xE000, 0x10FFFF}};

// ECMA-262's \d, \w, \s (WhiteSpace and LineTerminator code points).
const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kDot = complement({{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}});  // '.': no line terminator

struct Ast {
  enum Kind { kClass, kCat, kAlt, kRepeat } kind;
  Ranges ranges;                      // kClass
  std::vector<std::unique_ptr<Ast>> kids;  // kCat, kAlt, kRepeat (one)
  int32_t min = 0, max = 0;           // kRepeat; max -1: unbounded
};
std::unique_ptr<Ast> make(Ast::Kind k) {
  auto a = std::make_unique<Ast>();
  a->kind = k;
  return a;
}
std::unique_ptr<Ast> any_star() {
  auto cls = make(Ast::kClass);
  cls->ranges = {{0, kMaxCode}};
  auto r = make(Ast::kRepeat);
  r->min = 0;
  r->max = -1;
  r->kids.push_back(std::move(cls));
  return r;
}
}  // namespace

class PatternCompiler {
 public:
  PatternCompiler(std::string_view text, const std::string& what) : what_(what) {
    // the pattern's code points (UTF-8; a malformed byte stands for itself)
    for (size_t i = 0; i < text.size();) {
      const auto c = static_cast<uint8_t>(text[i]);
      const int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      uint32_t cp = n == 1 ? c : c & (0x3F >> (n - 1));
      bool ok = i + static_cast<size_t>(n) <= text.size();
      for (int k = 1; ok && k < n; ++k) {
        const auto d = static_cast<uint8_t>(text[i + static_cast<size_t>(k)]);
        ok = (d & 0xC0) == 0x80;
        cp = cp << 6 | (d & 0x3F);
      }
      if (!ok) bad(i, "is not UTF-8");
      cps_.push_back(cp);
      offsets_.push_back(i);
      i += static_cast<size_t>(n);
    }
    offsets_.push_back(text.size());
  }

  StringPattern compile() {
    auto root = make(Ast::kAlt);
    do {
      // a top-level alternative: `^` / `$` at its ends anchor it; otherwise it may sit anywhere
      auto cat = make(Ast::kCat);
      const bool head = at('^');
      if (head) ++i_;
      else cat->kids.push_back(any_star());
      parse_cat(*cat, true);
      const bool tail = at('$');
      if (tail) ++i_;
      else cat->kids.push_back(any_star());
      if (!end() && !at('|')) bad(offsets_[i_], at(')') ? "has a ')' without its '('" : "has '$' before its end");
      root->kids.push_back(std::move(cat));
    } while (!end() && cps_[i_++] == '|');
    const Info info = build(*root);
    StringPattern& p = out_;
    constexpr int kEnd = StringPattern::kMaxStates;
    p.start_ = info.first;
    if (info.nullable) set(p.start_, kEnd);
    for (size_t q = 0; q < p.pos_.size(); ++q)
      if (has(info.last, static_cast<int>(q))) set(p.pos_[q].follow, kEnd);
    trim();
    if (StringPattern::empty(p.start_)) fail("{} matches no string", what_);
    return std::move(out_);
  }

 private:
  struct Info {
    bool nullable = true;
    StringPattern::Set first{}, last{};
  };
  static void set(StringPattern::Set& s, int b) { s[static_cast<size_t>(b / 64)] |= uint64_t{1} << (b % 64); }
  static bool has(const StringPattern::Set& s, int b) { return (s[static_cast<size_t>(b / 64)] >> (b % 64)) & 1; }
  static void merge(StringPattern::Set& a, const StringPattern::Set& b) {
    for (size_t k = 0; k < a.size(); ++k) a[k] |= b[k];
  }

  [[noreturn]] void bad(size_t offset, const std::string& why) const { fail("{} {} (at byte {})", what_, why, offset); }
  bool end() const { return i_ >= cps_.size(); }
  bool at(uint32_t c) const { return !end() && cps_[i_] == c; }

  // alternatives inside a group
  std::unique_ptr<Ast> parse_alt() {
    auto alt = make(Ast::kAlt);
    for (;;) {
      auto cat = make(Ast::kCat);
      parse_cat(*cat, false);
      alt->kids.push_back(std::move(cat));
      if (!at('|')) break;
      ++i_;
    }
    return alt;
  }

  void parse_cat(Ast& cat, bool top) {
    while (!end() && !at('|') && !at(')')) {
      if (at('$') && top && (i_ + 1 == cps_.size() || cps_[i_ + 1] == '|')) return;  // the alternative's end anchor
      if (at('$') && !top && i_ + 1 == cps_.size()) bad(offsets_[i_], "has a '(' without its ')'");
      if (at('^') || at('$')) bad(offsets_[i_], fmt::format("has '{}' inside it: anchors are supported only at the ends of the pattern or of its top-level alternatives", static_cast<char>(cps_[i_])));
      cat.kids.push_back(parse_repeat());
    }
  }

  // an atom and its quantifiers
  std::unique_ptr<Ast> parse_repeat() {
    auto a = parse_atom();
    for (;;) {
      int32_t lo = 0, hi = 0;
      const size_t q = i_;
      if (at('*')) lo = 0, hi = -1, ++i_;
      else if (at('+')) lo = 1, hi = -1, ++i_;
      else if (at('?')) lo = 0, hi = 1, ++i_;
      else if (!counted(lo, hi)) return a;
      if (at('?')) ++i_;  // lazy: the same strings
      if (at('*') || at('+') || at('?') || (at('{') && counted_ahead()))
        bad(offsets_[i_], "has a quantifier after a quantifier (ECMA's \"nothing to repeat\"; group the first: (a*)*)");
      if (hi >= 0 && lo > hi) bad(offsets_[q], "has a repetition {n,m} with n above m");
      if (lo > 1000 || hi > 1000) bad(offsets_[q], "repeats more than 1000 times");
      auto r = make(Ast::kRepeat);
      r->min = lo;
      r->max = hi;
      r->kids.push_back(std::move(a));
      a = std::move(r);
    }
  }

  bool counted_ahead() {
    const size_t keep = i_;
    int32_t lo = 0, hi = 0;
    const bool q = counted(lo, hi);
    i_ = keep;
    return q;
  }

  // {n}, {n,}, {n,m}; false (and nothing read) when the '{' is a literal, as ECMA's Annex B reads it.
  // {,m} is refused: a literal to ECMA, a repetition to Python's re (jsonschema's).
  bool counted(int32_t& lo, int32_t& hi) {
    if (!at('{')) return false;
    if (i_ + 2 < cps_.size() && cps_[i_ + 1] == ',' && cps_[i_ + 2] >= '0' && cps_[i_ + 2] <= '9')
      bad(offsets_[i_], "has {,m}, which ECMA reads as text and other engines as a repetition: write {0,m} or \\{");
    size_t k = i_ + 1;
    auto number = [&](int32_t& v) {
      const size_t s = k;
      int64_t x = 0;
      for (; k < cps_.size() && cps_[k] >= '0' && cps_[k] <= '9'; ++k) x = std::min<int64_t>(x * 10 + (cps_[k] - '0'), 1 << 20);
      v = static_cast<int32_t>(x);
      return k > s;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (k < cps_.size() && cps_[k] == ',') {
      ++k;
      if (!number(hi)) hi = -1;
    }
    if (k >= cps_.size() || cps_[k] != '}') return false;
    i_ = k + 1;
    return true;
  }

  std::unique_ptr<Ast> parse_atom() {
    const size_t here = offsets_[i_];
    const uint32_t c = cps_[i_++];
    if (c == '(') {
      if (++depth_ > 64) bad(here, "nests groups deeper than 64");
      if (at('?')) {
        ++i_;
        if (at(':')) {
          ++i_;
        } else if (at('<') && i_ + 1 < cps_.size() && cps_[i_ + 1] != '=' && cps_[i_ + 1] != '!') {
          while (!end() && !at('>')) ++i_;  // a named group: its name
          if (end()) bad(here, "has a group name without its '>'");
          ++i_;
        } else if (at('=') || at('!') || at('<')) {
          bad(here, "has a lookahead / lookbehind group (not supported)");
        } else {
          bad(here, "has an inline flag or modifier group (?...) (not supported)");
        }
      }
      auto alt = parse_alt();
      if (!at(')')) bad(here, "has a '(' without its ')'");
      ++i_;
      --depth_;
      return alt;
    }
    auto cls = make(Ast::kClass);
    if (c == '[') {
      cls->ranges = parse_class(here);
    } else if (c == '.') {
      cls->ranges = kDot;
    } else if (c == '\\') {
      cls->ranges = parse_escape(false, here);
    } else if (c == '*' || c == '+' || c == '?') {
      bad(here, fmt::format("has '{}' with nothing to repeat", static_cast<char>(c)));
    } else if (c == ')') {
      bad(here, "has a ')' without its '('");
    } else {
      cls->ranges = {{c, c}};
    }
    cls->ranges = normalized(std::move(cls->ranges));
    return cls;
  }

  // After a '\': the characters it stands for. In a class, \b is a backspace.
  Ranges parse_escape(bool in_class, size_t here) {
    if (end()) bad(here, "ends with '\\'");
    const uint32_t c = cps_[i_++];
    auto hex = [&](int n) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        if (end()) bad(here, "has a short \\x / \\u escape");
        const uint32_t d = cps_[i_++];
        const int x = d >= '0' && d <= '9' ? static_cast<int>(d - '0') : (d | 0x20) >= 'a' && (d | 0x20) <= 'f' ? static_cast<int>((d | 0x20) - 'a' + 10) : -1;
        if (x < 0) bad(here, "has a \\x / \\u escape that is not hexadecimal");
        v = v * 16 + static_cast<uint32_t>(x);
      }
      return v;
    };
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 't': return {{0x09, 0x09}};
      case 'n': return {{0x0A, 0x0A}};
      case 'v': return {{0x0B, 0x0B}};
      case 'f': return {{0x0C, 0x0C}};
      case 'r': return {{0x0D, 0x0D}};
      case '0': return {{0, 0}};
      case 'x': {
        const uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        if (at('{')) bad(here, "has a \\u{...} escape (not supported)");
        uint32_t v = hex(4);
        // a surrogate pair written as two escapes is one character
        if (v >= 0xD800 && v <= 0xDBFF && i_ + 6 <= cps_.size() && cps_[i_] == '\\' && cps_[i_ + 1] == 'u') {
          const size_t back = i_;
          i_ += 2;
          const uint32_t low = hex(4);
          if (low >= 0xDC00 && low <= 0xDFFF) v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
          else i_ = back;
        }
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{0x08, 0x08}};
        bad(here, "has a word boundary \\b (not supported)");
      case 'B': bad(here, "has a word boundary \\B (not supported)");
      case 'c': bad(here, "has a control escape \\c (not supported)");
      case 'k': bad(here, "has a named back-reference \\k (not supported)");
      case 'p':
      case 'P': bad(here, "has a Unicode property escape \\p (not supported)");
      default:
        if (c >= '1' && c <= '9') bad(here, "has a back-reference (not supported)");
        return {{c, c}};  // an identity escape: \. \- \/ ...
    }
  }

  Ranges parse_class(size_t here) {
    bool negated = false;
    if (at('^')) {
      negated = true;
      ++i_;
    }
    Ranges r;
    while (!at(']')) {
      if (end()) bad(here, "has a '[' without its ']'");
      const size_t item = offsets_[i_];
      auto one = [&](bool& single) -> Ranges {
        const uint32_t c = cps_[i_++];
        if (c != '\\') {
          single = true;
          return {{c, c}};
        }
        const uint32_t letter = end() ? 0 : cps_[i_];  // \d \w \s and their negations are classes
        Ranges e = parse_escape(true, item);
        single = e.size() == 1 && e[0].first == e[0].second && letter != 'd' && letter != 'w' && letter != 's' && letter != 'D' &&
                 letter != 'W' && letter != 'S';
        return e;
      };
      bool single_lo = false;
      Ranges lo = one(single_lo);
      if (single_lo && at('-') && i_ + 1 < cps_.size() && cps_[i_ + 1] != ']') {
        ++i_;
        bool single_hi = false;
        Ranges hi = one(single_hi);
        if (!single_hi) bad(item, "has a class range whose end is a class escape");
        if (hi[0].first < lo[0].first) bad(item, "has a class range out of order");
        r.emplace_back(lo[0].first, hi[0].first);
      } else {
        r.insert(r.end(), lo.begin(), lo.end());
      }
    }
    ++i_;  // ']'
    return negated ? complement(r) : normalized(r);
  }

  // Glushkov's construction: each class occurrence a position; first / last sets and follow edges.
  Info build(const Ast& a) {
    // counted repetitions of empty groups make no positions but may nest: ((){1000}){1000} ...
    if (++steps_ > 100000) fail("{} repeats too much (counted repetitions unrolled to more than 100000 steps)", what_);
    Info r;
    switch (a.kind) {
      case Ast::kClass: {
        if (out_.pos_.size() >= static_cast<size_t>(StringPattern::kMaxStates))
          fail("{} has more than {} character positions (counted repetitions unrolled)", what_, StringPattern::kMaxStates);
        const int p = static_cast<int>(out_.pos_.size());
        out_.pos_.emplace_back().ranges = intersect(a.ranges, kWritable);
        r.nullable = false;
        set(r.first, p);
        set(r.last, p);
        return r;
      }
      case Ast::kCat:
        for (const auto& k : a.kids) concat(r, build(*k));
        return r;
      case Ast::kAlt:
        r.nullable = false;
        for (const auto& k : a.kids) {
          const Info b = build(*k);
          r.nullable |= b.nullable;
          merge(r.first, b.first);
          merge(r.last, b.last);
        }
        return r;
      case Ast::kRepeat: {
        const Ast& x = *a.kids[0];
        for (int32_t k = 0; k < a.min; ++k) concat(r, build(x));
        if (a.max < 0) {  // x*: its last positions go on to its first
          Info s = build(x);
          link(s.last, s.first);
          s.nullable = true;
          concat(r, s);
        } else {
          // (max - min) optional copies nested, (x(x(x)?)?)?: a copy follows only the one before it.
          // (Flat, x?x?x?, a copy follows every earlier one, and after k characters a state holds
          // all the later copies: a token mask under [a-z]{1,80} took 25x a plain string's.)
          Info tail;  // empty: nullable, no positions
          for (int32_t k = a.max; k > a.min; --k) {
            Info o = build(x);
            concat(o, tail);
            o.nullable = true;
            tail = o;
          }
          concat(r, tail);
        }
        return r;
      }
    }
    return r;
  }
  void link(const StringPattern::Set& from, const StringPattern::Set& to) {
    for (size_t q = 0; q < out_.pos_.size(); ++q)
      if (has(from, static_cast<int>(q))) merge(out_.pos_[q].follow, to);
  }
  void concat(Info& a, const Info& b) {
    link(a.last, b.first);
    if (a.nullable) merge(a.first, b.first);
    if (b.nullable) merge(a.last, b.last);
    else a.last = b.last;
    a.nullable = a.nullable && b.nullable;
  }

  // Drops the positions that cannot reach a match end; sets min_rest / max_rest.
  void trim() {
    auto& pos = out_.pos_;
    const int n = static_cast<int>(pos.size());
    constexpr int kEnd = StringPattern::kMaxStates;
    StringPattern::Set live{};
    set(live, kEnd);
    for (bool changed = true; changed;) {
      changed = false;
      for (int q = 0; q < n; ++q) {
        if (has(live, q) || pos[static_cast<size_t>(q)].ranges.empty()) continue;  // (an empty class takes nothing)
        const auto& f = pos[static_cast<size_t>(q)].follow;
        bool l = false;
        for (size_t k = 0; k < f.size(); ++k) l |= (f[k] & live[k]) != 0;
        if (l) {
          set(live, q);
          changed = true;
        }
      }
    }
    for (auto& p : pos)
      for (size_t k = 0; k < live.size(); ++k) p.follow[k] &= live[k];
    for (size_t k = 0; k < live.size(); ++k) out_.start_[k] &= live[k];
    // rests: fewest characters by relaxation; most by n + 1 rounds, beyond n only through a cycle
    constexpr int32_t kFar = 1 << 20;
    for (auto& p : pos) p.min_rest = kFar, p.max_rest = 0;
    for (int round = 0; round <= n; ++round) {
      for (int q = 0; q < n; ++q) {
        auto& p = pos[static_cast<size_t>(q)];
        if (!has(live, q)) continue;
        int32_t lo = kFar, hi = 0;
        for (int r = 0; r < n; ++r)
          if (has(p.follow, r)) lo = std::min(lo, pos[static_cast<size_t>(r)].min_rest), hi = std::max(hi, pos[static_cast<size_t>(r)].max_rest);
        if (has(p.follow, kEnd)) lo = 0;
        p.min_rest = std::min(p.min_rest, 1 + lo);
        p.max_rest = std::min(std::max(p.max_rest, 1 + hi), n + 2);
      }
    }
    for (auto& p : pos)
      if (p.max_rest > n) p.max_rest = StringPattern::kUnbounded;
  }

  const std::string& what_;
  std::vector<uint32_t> cps_;
  std::vector<size_t> offsets_;  // byte offset of each code point (and the end)
  size_t i_ = 0;
  int depth_ = 0;
  int64_t steps_ = 0;
  StringPattern out_;
};

StringPattern StringPattern::compile(std::string_view pattern, const std::string& what) {
  if (pattern.size() > 4096) fail("{} is longer than 4096 bytes", what);
  return PatternCompiler(pattern, what).compile();
}

std::string_view StringPattern::format_pattern(std::string_view format) {
  // RFC 3339 full-date / full-time / date-time (JSON Schema 2020-12 section 7.3.1) as Python's
  // datetime (pydantic) also reads them: years 0001-9999, a day within its month (Feb 29 in leap
  // years), no leap second, an offset; an RFC 4122 UUID; a plain address; dotted-quad IPv4.
#define MK_YEAR R"((?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9]))"
#define MK_MONTH_DAY R"((?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8])))"
#define MK_LEAP_YEAR R"((?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00))"
#define MK_DATE "(?:" MK_YEAR "-" MK_MONTH_DAY "|" MK_LEAP_YEAR "-02-29)"
#define MK_TIME R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d))"
  if (format == "date") return "^" MK_DATE "$";
  if (format == "time") return "^" MK_TIME "$";
  if (format == "date-time") return "^" MK_DATE "[Tt]" MK_TIME "$";
#undef MK_YEAR
#undef MK_MONTH_DAY
#undef MK_LEAP_YEAR
#undef MK_DATE
#undef MK_TIME
  if (format == "uuid") return R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)";
  if (format == "email")
    return R"(^[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}$)";
  if (format == "ipv4") return R"(^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)";
  return {};
}

StringPattern::Set StringPattern::step(const Set& s, uint32_t lo, uint32_t hi) const {
  Set out{};
  for (size_t k = 0; k < 4; ++k)
    for (uint64_t bits = s[k]; bits; bits &= bits - 1) {
      const size_t q = k * 64 + static_cast<size_t>(__builtin_ctzll(bits));
      if (q >= pos_.size()) continue;  // the match end takes no character
      const auto& r = pos_[q].ranges;
      // the first range ending at or after lo: does it begin by hi?
      auto it = std::lower_bound(r.begin(), r.end(), lo, [](const std::pair<uint32_t, uint32_t>& x, uint32_t v) { return x.second < v; });
      if (it != r.end() && it->first <= hi)
        for (size_t j = 0; j < 4; ++j) out[j] |= pos_[q].follow[j];
    }
  return out;
}

bool StringPattern::matches(std::string_view text) const {
  Set s = start_;
  for (size_t i = 0; i < text.size() && !empty(s);) {
    const auto c = static_cast<uint8_t>(text[i]);
    const int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    uint32_t cp = n == 1 ? c : c & (0x3F >> (n - 1));
    for (int k = 1; k < n && i + static_cast<size_t>(k) < text.size(); ++k) cp = cp << 6 | (static_cast<uint8_t>(text[i + static_cast<size_t>(k)]) & 0x3F);
    s = step(s, cp, cp);
    i += static_cast<size_t>(n);
  }
  return accepts(s);
}

// (the positions of s by their set bits: a state holds few of a long pattern's positions)
int32_t StringPattern::min_rest(const Set& s) const {
  int32_t m = accepts(s) ? 0 : kUnbounded;
  for (size_t k = 0; k < 4; ++k)
    for (uint64_t bits = s[k]; bits; bits &= bits - 1)
      if (const size_t q = k * 64 + static_cast<size_t>(__builtin_ctzll(bits)); q < pos_.size()) m = std::min(m, pos_[q].min_rest);
  return m;
}

int32_t StringPattern::max_rest(const Set& s) const {
  int32_t m = 0;
  for (size_t k = 0; k < 4; ++k)
    for (uint64_t bits = s[k]; bits; bits &= bits - 1)
      if (const size_t q = k * 64 + static_cast<size_t>(__builtin_ctzll(bits)); q < pos_.size()) m = std::max(m, pos_[q].max_rest);
  return m;
}

}  // namespace mk
