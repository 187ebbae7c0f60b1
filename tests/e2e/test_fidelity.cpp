// The fixtures of ../shared/fixtures/bugs (see its README.md): each row's right value as a test,
// through the runtime (every backend) and the CLI, as a user calls it.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "support/errors.h"
#include "support/cli.h"

using mk::test::run_cli;

namespace mk {
namespace {

const std::string kBugs = std::string(MK_SHARED_DIR) + "/fixtures/bugs/";

std::string generate_error(const std::string& dir, const std::string& backend, float temperature) {
  SessionOptions so;
  so.model_path = kBugs + dir;
  so.backend = backend;
  so.backend_options.threads = 2;
  Session s(so);
  GenerateOptions go;
  go.prompt = "hello world";
  go.n_new = 6;
  go.ignore_eos = true;
  go.sampler.temperature = temperature;
  return test::error_of([&] { generate(s, go); });
}

// logits_all_nan: every logit NaN; logits_nan_at_token0: one NaN, at token 0. Both are errors
// naming the step and position, greedy and sampling, on every CPU-side backend.
TEST(E2EFidelity, NonFiniteLogitsAreAnErrorOnEveryBackend) {
  for (const char* dir : {"logits_all_nan", "logits_nan_at_token0"})
    for (const char* backend : {"reference", "cpu"})
      for (float temp : {0.0f, 0.8f}) {
        std::string e = generate_error(dir, backend, temp);
        EXPECT_NE(e.find("logits are not finite at generation step 0 (position 7)"), std::string::npos)
            << dir << " " << backend << " temp " << temp << ": " << e;
        EXPECT_NE(e.find("token 0 is nan"), std::string::npos) << e;
      }
}

TEST(E2EFidelity, NonFiniteLogitsCliExitsNonZero) {
  for (const char* dir : {"logits_all_nan", "logits_nan_at_token0"})
    for (const char* temp : {"0", "1"}) {
      int status = 0;
      std::string out = run_cli("run -m " + kBugs + dir + " -p 'hello world' -n 6 --temp " + temp +
                                    " --ignore-eos --json",
                                &status);
      EXPECT_NE(status, 0) << dir << ": " << out;
      EXPECT_NE(out.find("error: logits are not finite"), std::string::npos) << out;
    }
}

// `logits` as `run`: non-finite logits are an error naming the position, exit 1, no JSON (not nulls
// and an argmax of -1 with exit 0).
TEST(E2EFidelity, NonFiniteLogitsLogitsCommandExitsNonZero) {
  for (const char* dir : {"logits_all_nan", "logits_nan_at_token0"})
    for (const char* backend : {"reference", "cpu"}) {
      int status = 0;
      std::string err;
      const std::string out =
          run_cli(std::string("logits -m ") + kBugs + dir + " --ids 1,403 --backend " + backend, &status, &err);
      EXPECT_EQ(status, 1) << dir << " " << backend << ": " << err;
      EXPECT_NE(err.find("error: logits are not finite at position 0 (id 1): token 0 is nan"), std::string::npos)
          << dir << " " << backend << ": " << err;
      EXPECT_EQ(out, "") << dir << " " << backend;
    }
}

// The rule does not depend on where the bad value sits, and a NaN never wins argmax.
TEST(SamplerNonFinite, RejectedWhereverTheyAre) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float bad : {nan, inf, -inf})
    for (size_t at : {size_t{0}, size_t{3}, size_t{7}}) {
      std::vector<float> row = {0.5f, 2.0f, 1.0f, -1.0f, 0.0f, 1.5f, 0.25f, 0.1f};
      row[at] = bad;
      for (float temp : {0.0f, 1.0f}) {
        Sampler s(SamplerOptions{temp, 0, 1.0f, 1});
        std::string e = test::error_of([&] { s.sample(row); });
        EXPECT_NE(e.find(fmt::format("token {} is", at)), std::string::npos) << e;
      }
      std::string e = test::error_of([&] { check_finite_logits(row, "generation step 4 (position 9)"); });
      EXPECT_NE(e.find("at generation step 4 (position 9)"), std::string::npos) << e;
    }
  std::vector<float> row = {nan, 1.0f, 3.0f, nan, 2.0f};
  EXPECT_EQ(argmax(row), 2);
  row = {1.0f, 3.0f, nan};
  EXPECT_EQ(argmax(row), 1);
  row = {nan, nan};
  EXPECT_EQ(argmax(row), -1);
}

TEST(E2EFidelity, AddBosFalseCli) {
  int status = 0;
  std::string out = run_cli("run -m " + kBugs + "add_bos_false.gguf -p 'Once upon a time' -n 0 --json", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["prompt_ids"], nlohmann::json::parse("[403,407,261,378]"));
}

TEST(E2EFidelity, SafetensorsDuplicateNameCli) {
  int status = 0;
  std::string out = run_cli("logits -m " + kBugs + "safetensors_duplicate_name --ids 1,2,3", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  EXPECT_NE(out.find("model.norm.weight"), std::string::npos) << out;
}

}  // namespace
}  // namespace mk
