// support/env.h: the development knobs' parser.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/env.h"
#include "support/error.h"

namespace mk {
namespace {

std::string error_of(const char* value, int64_t lo, int64_t hi) {
  ::setenv("MK_TEST_ENV_KNOB", value, 1);
  try {
    env_int("MK_TEST_ENV_KNOB", 7, lo, hi);
  } catch (const Error& e) {
    ::unsetenv("MK_TEST_ENV_KNOB");
    return e.what();
  }
  ::unsetenv("MK_TEST_ENV_KNOB");
  return "";
}

TEST(SupportEnv, WholeNumbersInRangeOrAnErrorNamingTheVariable) {
  ::unsetenv("MK_TEST_ENV_KNOB");
  EXPECT_EQ(env_int("MK_TEST_ENV_KNOB", 7, 1, 10), 7);
  ::setenv("MK_TEST_ENV_KNOB", "", 1);  // empty = unset
  EXPECT_EQ(env_int("MK_TEST_ENV_KNOB", 7, 1, 10), 7);
  ::setenv("MK_TEST_ENV_KNOB", "10", 1);
  EXPECT_EQ(env_int("MK_TEST_ENV_KNOB", 7, 1, 10), 10);
  ::setenv("MK_TEST_ENV_KNOB", "-3", 1);
  EXPECT_EQ(env_int("MK_TEST_ENV_KNOB", 7, -5, 10), -3);
  ::unsetenv("MK_TEST_ENV_KNOB");
  for (const char* bad : {"abc", " 1", "1 ", "0x10", "1.5", "1e3", "-", "--1", "+1"})
    EXPECT_EQ(error_of(bad, 1, 10), std::string("MK_TEST_ENV_KNOB=") + bad + ": not a whole number (expected one in [1, 10])")
        << bad;
  // Out of range, including past 64 bits (strtoll would clamp) and past 32 bits (a cast would wrap).
  for (const char* bad : {"0", "11", "4294967297", "99999999999999999999", "-99999999999999999999"})
    EXPECT_EQ(error_of(bad, 1, 10), std::string("MK_TEST_ENV_KNOB=") + bad + ": out of range (expected a whole number in [1, 10])")
        << bad;
}

TEST(SupportEnv, FlagsAreZeroOrOne) {
  ::unsetenv("MK_TEST_ENV_FLAG");
  EXPECT_TRUE(env_flag("MK_TEST_ENV_FLAG", true));
  ::setenv("MK_TEST_ENV_FLAG", "0", 1);
  EXPECT_FALSE(env_flag("MK_TEST_ENV_FLAG", true));
  ::setenv("MK_TEST_ENV_FLAG", "1", 1);
  EXPECT_TRUE(env_flag("MK_TEST_ENV_FLAG", false));
  for (const char* bad : {"2", "-1", "yes", "01", " 1"}) {
    ::setenv("MK_TEST_ENV_FLAG", bad, 1);
    EXPECT_THROW(env_flag("MK_TEST_ENV_FLAG", false), Error) << bad;
  }
  ::unsetenv("MK_TEST_ENV_FLAG");
}

}  // namespace
}  // namespace mk
