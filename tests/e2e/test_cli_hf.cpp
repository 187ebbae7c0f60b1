// The `logits` and `run` commands on Hugging Face directories, as a user calls them.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "support/compare.h"
#include "support/cli.h"

using mk::test::run_cli;

namespace {

TEST(E2EHfCli, LogitsMatchTransformersOnEveryFixture) {
  const std::string root = std::string(MK_SHARED_DIR) + "/fixtures/hf/";
  for (const char* family : {"llama_gqa", "llama3_scaled_tied", "llama_mha_headdim", "mistral", "qwen2_bias",
                             "qwen3_qknorm", "gemma", "phi3", "gpt2"})
    for (const char* dtype : {"float32", "bfloat16"}) {
      const std::string dir = root + family + "_" + dtype;
      std::ifstream in(dir + "/reference.json");
      ASSERT_TRUE(in.good()) << dir;
      auto ref = nlohmann::json::parse(in);
      std::string ids;
      for (int id : ref["prompt_ids"]) {
        if (!ids.empty()) ids += ',';
        ids += std::to_string(id);
      }
      for (const char* backend : {"reference", "cpu"}) {
        int status = 0;
        std::string out = run_cli(std::string("logits --backend ") + backend + " -m " + dir + " --ids " + ids, &status);
        ASSERT_EQ(status, 0) << dir << "\n" << out;
        auto j = nlohmann::json::parse(out);
        EXPECT_EQ(j["argmax_all"], ref["logits_all_argmax"]) << dir << " " << backend;
        EXPECT_LT(mk::test::rel_l2(j["logits_last"].get<std::vector<double>>(), ref["logits_last"].get<std::vector<double>>()),
                  1e-4)
            << dir << " " << backend;
      }
    }
}

TEST(E2EHfCli, RunOnADirectory) {
  int status = 0;
  std::string out = run_cli("run --json --temp 0 -n 4 -m " + std::string(MK_SHARED_DIR) + "/fixtures/hf/qwen2_bias_float32 -p 'Hello world'", &status);
  ASSERT_EQ(status, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["generated_ids"].size(), 4u);
  // bytelevel_bpe_expected.json: "Hello world" -> these ids (the fixtures share that tokenizer).
  EXPECT_EQ(j["prompt_ids"], nlohmann::json::parse("[40,69,275,79,309,261,76,68]"));
}

}  // namespace
