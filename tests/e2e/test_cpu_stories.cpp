// End-to-end: the CPU interpreter reproduces llama2.c's greedy reference for stories260K token for
// token, from the .bin and the .gguf, for every worker count and schedule; and via the CLI.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "runtime/session.h"
#include "support/cli.h"

using namespace mk;

namespace {

const std::string kDir = std::string(MK_SHARED_DIR) + "/models/stories260K/";

nlohmann::json cases() { return mk::test::stories_reference(); }

void check(const std::string& model, int threads, const std::string& schedule) {
  SessionOptions so;
  so.model_path = kDir + model;
  so.backend = "cpu";
  so.backend_options.threads = threads;
  so.backend_options.schedule = schedule;
  Session s(so);
  for (const auto& c : cases()) {
    s.reset();
    GenerateOptions go;
    go.prompt = c["prompt"].get<std::string>();
    go.sampler.temperature = 0;
    auto prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    go.n_new = static_cast<int>(c["generated_ids"].size());
    GenerateResult r = generate(s, go);
    EXPECT_EQ(r.prompt_ids, prompt_ids);
    EXPECT_EQ(r.generated_ids, c["generated_ids"].get<std::vector<int32_t>>())
        << model << ", " << threads << " threads, " << schedule << ", prompt '" << go.prompt << "'";
  }
}

}  // namespace

class E2ECpuStories : public ::testing::TestWithParam<std::tuple<std::string, int, std::string>> {};

TEST_P(E2ECpuStories, ReproducesRunCGreedy) {
  auto [model, threads, schedule] = GetParam();
  check(model, threads, schedule);
}

INSTANTIATE_TEST_SUITE_P(E2ECpu, E2ECpuStories,
                         ::testing::Combine(::testing::Values("stories260K.bin", "stories260K.gguf"),
                                            ::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values("dynamic", "static-rr", "static-cp")),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_t" + std::to_string(std::get<1>(info.param)) + "_" +
                                           std::get<2>(info.param);
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(E2ECpuCli, RunDefaultsToCpuAndMatchesReference) {
  auto all = cases();
  const auto& c = all[1];
  auto prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
  int n = static_cast<int>(c["generated_ids"].size());
  std::string cmd = std::string(MK_CLI_PATH) + " run --json --temp 0 --threads 3 --schedule static-cp -m " + kDir +
                    "stories260K.bin -n " + std::to_string(n) + " -p '" + c["prompt"].get<std::string>() + "' 2>&1";
  int status = 0;
  const std::string out = mk::test::run_shell(cmd, &status);
  ASSERT_EQ(status, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["generated_ids"], c["generated_ids"]);
}

using mk::test::run_cli;

TEST(E2ECpuCli, CompileEmitsProgramAndIr) {
  int st = 0;
  std::string prog = run_cli("compile -m " + kDir + "stories260K.gguf --emit program -t 2", &st);
  ASSERT_EQ(st, 0) << prog;
  EXPECT_NE(prog.find("attention L4"), std::string::npos) << prog;
  EXPECT_NE(prog.find("instructions per step"), std::string::npos) << prog;
  EXPECT_NE(prog.find("arena"), std::string::npos) << prog;
  std::string ir = run_cli("compile -m " + kDir + "stories260K.bin --emit ir", &st);
  ASSERT_EQ(st, 0) << ir;
  EXPECT_NE(ir.find("fused_matmul"), std::string::npos);
  const std::string out = ::testing::TempDir() + "/mk_prog.txt";
  std::string msg = run_cli("compile -m synth:micro --emit program-full -o " + out, &st);
  ASSERT_EQ(st, 0) << msg;
  EXPECT_NE(msg.find("wrote"), std::string::npos);
  std::string bad = run_cli("compile -m synth:nosuch", &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(bad.find("unknown synthetic model"), std::string::npos) << bad;
}

TEST(E2ECpuCli, RunWritesATrace) {
  int st = 0;
  const std::string trace = ::testing::TempDir() + "/mk_cli_trace.json";
  std::string out = run_cli("run --backend cpu -t 2 --temp 0 -n 5 -p 'Once' --trace " + trace + " -m " + kDir + "stories260K.bin", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("busy"), std::string::npos) << out;
  std::ifstream f(trace);
  EXPECT_TRUE(f.good());
}
