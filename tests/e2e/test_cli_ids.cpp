// `run --ids` (a prompt as token ids, no tokenizer needed) and the shapes-only `compile` / `info`,
// as a user calls them.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "archs/arch.h"
#include "model/synth.h"
#include "passes/pass.h"
#include "runtime/session.h"
#include "support/cli.h"

namespace {

// Runs the CLI; stdout only (stderr goes to *err when given, else is dropped).
std::string cli(const std::string& args, int* status, std::string* err = nullptr) {
  if (err) return mk::test::run_cli(args, status, err);
  return mk::test::run_shell(std::string(MK_CLI_PATH) + " " + args + " 2>/dev/null", status);
}

std::string join(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

// Greedy decoding by hand: each generated id is the argmax of `logits` over the prompt and the ids
// generated before it.
TEST(E2ECliIds, RunIdsOnASyntheticModelIsGreedyArgmax) {
  int status = 0;
  std::string err;
  std::string out = cli("run --json --temp 0 -n 4 -m synth:stories260k --ids 1,403,407", &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["prompt_ids"], nlohmann::json::parse("[1,403,407]"));
  EXPECT_EQ(j["text"], "");
  EXPECT_EQ(j["stop_reason"], "n_new");
  std::vector<int> seq = {1, 403, 407};
  auto gen = j["generated_ids"].get<std::vector<int>>();
  ASSERT_EQ(gen.size(), 4u);
  for (int g : gen) {
    auto l = nlohmann::json::parse(cli("logits -m synth:stories260k --ids " + join(seq), &status));
    ASSERT_EQ(status, 0);
    EXPECT_EQ(g, l["argmax_all"].back().get<int>()) << "after " << join(seq);
    seq.push_back(g);
  }
  // Streaming mode without a tokenizer prints the generated ids.
  out = cli("run --temp 0 -n 4 -m synth:stories260k --ids 1,403,407", &status);
  ASSERT_EQ(status, 0);
  EXPECT_EQ(out, std::to_string(gen[0]) + " " + std::to_string(gen[1]) + " " + std::to_string(gen[2]) + " " +
                     std::to_string(gen[3]) + "\n");
}

// With a tokenizer, --ids gives what -p gives for the same ids: generated ids, text and EOS stop.
TEST(E2ECliIds, RunIdsMatchesTheTextPrompt) {
  const std::string model = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  int status = 0;
  auto by_text = nlohmann::json::parse(cli("run --json --temp 0 -n 40 -m " + model + " -p 'Once upon a time'", &status));
  ASSERT_EQ(status, 0);
  std::string ids = join(by_text["prompt_ids"].get<std::vector<int>>());
  auto by_ids = nlohmann::json::parse(cli("run --json --temp 0 -n 40 -m " + model + " --ids " + ids, &status));
  ASSERT_EQ(status, 0);
  EXPECT_EQ(by_ids["prompt_ids"], by_text["prompt_ids"]);
  EXPECT_EQ(by_ids["generated_ids"], by_text["generated_ids"]);
  EXPECT_EQ(by_ids["text"], by_text["text"]);
  EXPECT_FALSE(by_ids["text"].get<std::string>().empty());
  // Streaming: the prompt decoded, then the generated text.
  std::string out = cli("run --temp 0 -n 40 -m " + model + " --ids " + ids, &status);
  ASSERT_EQ(status, 0);
  std::string expected = "Once upon a time";
  expected += by_text["text"].get<std::string>();
  expected += "\n";
  EXPECT_EQ(out, expected);
}

TEST(E2ECliIds, BadIdsAreErrors) {
  int status = 0;
  std::string err;
  cli("run -m synth:stories260k --ids 1,512", &status, &err);
  EXPECT_EQ(status, 1);
  EXPECT_NE(err.find("error: prompt token id 512 is outside the vocabulary [0, 512)"), std::string::npos) << err;
  // a malformed list is a usage error (exit 2), as every other malformed option value
  for (const char* bad : {"1,two", "1,2,", "1,,2", "99999999999", "-1", "1,-2"}) {
    cli(std::string("run -m synth:stories260k --ids ") + bad, &status, &err);
    EXPECT_EQ(status, 2) << bad;
    EXPECT_NE(err.find("error: --ids: '"), std::string::npos) << bad << ": " << err;
    if (std::string(bad) == "99999999999") {
      EXPECT_NE(err.find("'99999999999' is not a token id"), std::string::npos) << err;
    }
  }
  EXPECT_NE(err.find("'-2' is not a token id (ids are 0 or more)"), std::string::npos) << err;
  cli("logits -m synth:stories260k --ids 1,two", &status, &err);
  EXPECT_EQ(status, 2);
  EXPECT_NE(err.find("error: --ids: 'two' is not a token id"), std::string::npos) << err;
  cli("run -m synth:stories260k --ids 1 -p hello", &status, &err);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("excludes"), std::string::npos) << err;
  cli("run -m synth:stories260k -p hello", &status, &err);  // a text prompt still needs a tokenizer
  EXPECT_EQ(status, 1);
  EXPECT_NE(err.find("carry no tokenizer"), std::string::npos) << err;
}

// `info` and `compile` read shapes only: the 8B shape (16 GB of weights) opens at once, and the
// compiled program is the one compile_program gives for the same graph.
TEST(E2ECliIds, InfoAndCompileUseShapesOnly) {
  int status = 0;
  std::string out = cli("info -m synth:llama3.1-8b", &status);
  ASSERT_EQ(status, 0) << out;
  size_t total = 0;
  const mk::ModelFile shapes = mk::make_synthetic_model(mk::synthetic_spec("llama3.1-8b"), false);
  for (const auto& t : shapes.tensors()) total += t.nbytes;
  EXPECT_NE(out.find("total: " + std::to_string(total) + " bytes"), std::string::npos) << out;

  const std::string path = ::testing::TempDir() + "mk_cli_ids_program.txt";
  cli("compile -m synth:llama3.2-1b --emit program -t 132 -o " + path, &status);
  ASSERT_EQ(status, 0);
  std::ifstream f(path);
  std::stringstream listing;
  listing << f.rdbuf();
  mk::ModelFile m = mk::open_model("synth:llama3.2-1b", false);
  mk::Graph g = mk::build_graph(m, mk::BuildOptions{4096, false});
  mk::CompileOptions co;
  co.workers = 132;
  EXPECT_EQ(listing.str(), mk::compile_program(g, co).listing());
}

}  // namespace

// `logits -c N`: the context of the evaluation. phi3 LongRoPE picks its factors by context, so the
// same ids give llama.cpp's "short" logits at n_ctx 32 and its "long" ones at n_ctx 64
// (tests/data/phi3_longrope/expected.json); a context below the ids is an error.
TEST(E2ECliIds, LogitsContextSizePicksLongRopeFactors) {
  const std::string dir = std::string(MK_SOURCE_DIR) + "/tests/data/phi3_longrope/";
  const auto want = mk::test::read_json(dir + "expected.json");
  ASSERT_FALSE(want.is_null());
  const std::string ids = join(want["prompt_ids"].get<std::vector<int>>());
  for (const char* which : {"short", "long"}) {
    int status = 0;
    const int64_t n_ctx = want[which]["n_ctx"].get<int64_t>();
    const std::string out =
        cli("logits -m " + dir + "phi3-longrope.f32.gguf --ids " + ids + " -c " + std::to_string(n_ctx), &status);
    ASSERT_EQ(status, 0) << out;
    const auto got = nlohmann::json::parse(out)["logits_last"].get<std::vector<double>>();
    const auto ref = want[which]["logits"].back().get<std::vector<double>>();
    ASSERT_EQ(got.size(), ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    EXPECT_LT(std::sqrt(num / den), 2e-5) << which << " (n_ctx " << n_ctx << ")";
  }
  int status = 0;
  std::string err;
  cli("logits -m " + dir + "phi3-longrope.f32.gguf --ids " + ids + " -c 3", &status, &err);
  EXPECT_EQ(status, 2);
  EXPECT_NE(err.find("--ctx-size 3 is smaller than the 24 ids"), std::string::npos) << err;
}
