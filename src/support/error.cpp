#include "support/error.h"
#include "support/printable.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace mk {

std::string printable(std::string_view s, size_t max) {
  std::string out;
  const size_t n = std::min(s.size(), max);
  for (size_t i = 0; i < n;) {
    const auto c = static_cast<unsigned char>(s[i]);
    // Length of a well-formed UTF-8 sequence starting here (0: not one); overlongs and surrogates are not.
    size_t len = 0;
    if (c >= 0x20 && c < 0x7f) len = 1;
    else if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) len = 3;
    else if (c >= 0xf0 && c <= 0xf4) len = 4;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && len >= 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0) && !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  if (s.size() > max) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "internal error: %s:%d: check failed: %s %s\n", file, line, expr, msg.c_str());
  std::abort();
}
}  // namespace mk
