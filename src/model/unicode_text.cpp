#include "model/unicode_text.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "support/error.h"

namespace mk {

namespace {

// Code points of valid UTF-8 text.
std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t i = 0, n = static_cast<utf8proc_ssize_t>(s.size());
  while (i < n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
    if (len <= 0)
      fail("tokenizer: the text is not valid UTF-8 (byte 0x{:02x} at offset {})", static_cast<unsigned char>(s[static_cast<size_t>(i)]), i);
    out.push_back(static_cast<char32_t>(cp));
    i += len;
  }
  return out;
}

void append(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

}  // namespace

size_t utf8_invalid_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  const auto n = static_cast<utf8proc_ssize_t>(s.size());
  utf8proc_ssize_t i = 0;
  while (i < n) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
    if (len <= 0) break;
    i += len;
  }
  return static_cast<size_t>(i);
}

std::string unicode_normalize(std::string_view s, UnicodeForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case UnicodeForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case UnicodeForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case UnicodeForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  if (s.empty()) return {};
  utf8proc_uint8_t* out = nullptr;
  // Explicit length (no NULLTERM): an embedded NUL is a character like any other.
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out, static_cast<utf8proc_option_t>(options));
  if (n < 0) fail("tokenizer: cannot normalize text: {}", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

std::string unicode_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s)) {
    if (c == 0x130) {  // the one unconditional multi-character lowercase mapping (SpecialCasing.txt)
      out += 'i';
      append(out, 0x307);
      continue;
    }
    append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

bool unicode_is_whitespace(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string unicode_strip(std::string_view s, bool left, bool right) {
  std::vector<char32_t> cps = decode(s);
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && unicode_is_whitespace(cps[b])) ++b;
  if (right)
    while (e > b && unicode_is_whitespace(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) append(out, cps[i]);
  return out;
}

std::string unicode_strip_accents(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s))
    if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) != UTF8PROC_CATEGORY_MN) append(out, c);
  return out;
}

}  // namespace mk
