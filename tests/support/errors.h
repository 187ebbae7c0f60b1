// The mk::Error message of a call, for tests that assert on error text.
#pragma once
#include <string>

#include "support/error.h"

namespace mk::test {

// The message f() throws as mk::Error, or "<no error>" when it returns normally.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace mk::test
