#include "support/env.h"

#include <cerrno>
#include <cstdlib>

#include "support/error.h"

namespace mk {

int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  const char* digits = v[0] == '-' ? v + 1 : v;
  bool ok = *digits != '\0';
  for (const char* c = digits; *c; ++c) ok = ok && *c >= '0' && *c <= '9';
  if (!ok) fail("{}={}: not a whole number (expected one in [{}, {}])", name, v, lo, hi);
  errno = 0;
  const long long x = std::strtoll(v, nullptr, 10);
  if (errno == ERANGE || x < lo || x > hi) fail("{}={}: out of range (expected a whole number in [{}, {}])", name, v, lo, hi);
  return x;
}

bool env_flag(const char* name, bool def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  if ((v[0] == '0' || v[0] == '1') && v[1] == '\0') return v[0] == '1';
  fail("{}={}: expected 0 or 1", name, v);
}

}  // namespace mk
