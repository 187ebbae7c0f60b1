// User-facing errors and internal invariant checks.
//
// Bad input (a damaged file, a wrong shape, an unsupported type or architecture) throws mk::Error
// with the context in its message, e.g. "blk.3.attn_q.weight: expected [64, 64], got [64, 32]".
// The CLI catches it, prints it and exits non-zero. Broken internal invariants use MK_CHECK, which
// aborts with file:line: they are bugs, not input errors.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace mk {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Options that cannot work together (e.g. --schedule with the reference backend): bad input like any
// Error, but the CLI exits 2 as for a command line it cannot parse.
class UsageError : public Error {
 public:
  using Error::Error;
};

template <class... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace mk

#define MK_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) ::mk::check_failed(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
