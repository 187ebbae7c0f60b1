#include "support/error.h"

#include <cstdio>
#include <cstdlib>

namespace mk {
void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "internal error: %s:%d: check failed: %s %s\n", file, line, expr, msg.c_str());
  std::abort();
}
}  // namespace mk
