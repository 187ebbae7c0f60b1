// What a new user meets first: option values, synthetic model paths, `info`'s label, a damaged
// tokenizer, the reference backend's flags. Each case runs the CLI as a user would and reads its
// exit status and its words.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/cli.h"

namespace {

struct Result {
  int status = 0;
  std::string out, err;
};

Result cli(const std::string& args) {
  Result r;
  r.out = mk::test::run_cli(args, &r.status, &r.err);
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Integer options: a non-number is "not a whole number", a negative count is out of range, both
// named by their option, exit 2 (usage) before anything loads.
TEST(E2ECliUsage, IntegerOptionsSayWhatIsWrong) {
  Result r = cli("run -m synth:tiny --ids 1 --attn-splits abc");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: --attn-splits: 'abc' is not a whole number")) << r.err;
  r = cli("run -m synth:tiny --ids 1 --attn-splits 65");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "--attn-splits: 65 is out of range: it must be 0 to 64")) << r.err;
  for (const char* cmd : {"run -m synth:tiny --ids 1", "logits -m synth:tiny --ids 1", "compile -m synth:tiny --emit ir",
                          "chat -m synth:tiny", "serve -m synth:tiny"}) {
    r = cli(std::string(cmd) + " -t -1");
    EXPECT_EQ(r.status, 2) << cmd;
    EXPECT_TRUE(has(r.err, "error: --threads: -1 is out of range: it must be 0 or more")) << cmd << ": " << r.err;
  }
  r = cli("run -m synth:tiny --ids 1 -n 1.5");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "--n-predict: '1.5' is not a whole number")) << r.err;
  r = cli("run -m synth:tiny --ids 1 -c -4");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "--ctx-size: -4 is out of range")) << r.err;
  // 0 is the documented default (all cores) and runs.
  r = cli("run -m synth:tiny --ids 1 -n 1 -t 0");
  EXPECT_EQ(r.status, 0) << r.err;
}

// The oracle computes attention in one pass: a split count other than 1 is refused, not ignored.
TEST(E2ECliUsage, ReferenceBackendRefusesAttnSplits) {
  Result r = cli("logits -m synth:tiny --ids 1,2,3 --backend reference --attn-splits 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: --attn-splits 4: the reference backend computes attention in one pass")) << r.err;
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --backend reference --attn-splits 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "--attn-splits 0: the reference backend")) << r.err;
  r = cli("logits -m synth:tiny --ids 1,2,3 --backend reference --attn-splits 1");
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(E2ECliUsage, SyntheticPathWithEmptyTypeIsAnError) {
  Result r = cli("info -m synth:stories260k:");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: synth:stories260k:: no type after the ':'")) << r.err;
  for (const char* type : {"f32", "f16", "bf16", "q4_0", "q8_0", "q4_K", "q6_K"})
    EXPECT_TRUE(has(r.err, type)) << "the types are listed: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = cli("info -m synth:stories260k:q9");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "unknown dtype 'q9'")) << r.err;
}

// stories260k is 64 wide: K-quant rows (256-element super-blocks) do not fit; the note names the
// tensors that fell back and why. Types whose blocks fit say nothing.
TEST(E2ECliUsage, SyntheticKQuantFallbackIsNamed) {
  Result r = cli("info -m synth:stories260k:q4_K");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "note: synth:stories260k:q4_K: q4_K needs rows that are a multiple of 256 elements")) << r.err;
  EXPECT_TRUE(has(r.err, "blk.*.attn_q.weight (rows of 64: q8_0)")) << r.err;
  EXPECT_TRUE(has(r.err, "token_embd.weight (rows of 64: q8_0)")) << r.err;
  EXPECT_TRUE(has(r.err, "blk.*.ffn_down.weight (rows of 172: f32)")) << r.err;  // 172 is no multiple of 32
  EXPECT_FALSE(has(r.err, "blk.0.")) << "one entry per name, not per layer: " << r.err;
  EXPECT_TRUE(has(r.out, "blk.3.attn_q.weight")) << r.out;
  r = cli("info -m synth:stories260k:q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "blk.*.ffn_down.weight (rows of 172: f32)")) << r.err;
  EXPECT_FALSE(has(r.err, "attn_q")) << r.err;
  r = cli("info -m synth:stories260k");
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(E2ECliUsage, InfoLabelsSyntheticModels) {
  Result r = cli("info -m synth:tiny");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "model:        synth:tiny (synthetic: random weights, no tokenizer)")) << r.out;
  EXPECT_FALSE(has(r.out, "(gguf)")) << r.out;
  r = cli("info -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "stories260K.gguf (gguf)")) << r.out;
}

TEST(E2ECliUsage, KvTypeHelpSaysWhatAutoPicks) {
  for (const char* cmd : {"run", "chat", "logits"}) {
    Result r = cli(std::string(cmd) + " --help");
    EXPECT_EQ(r.status, 0);
    EXPECT_TRUE(has(r.out, "auto (f16 for GGUF files with quantized weights, else f32)")) << cmd << ": " << r.out;
  }
}

// stories260K.gguf with tokenizer.ggml.model "llama" changed to "llamx": the tokenizer is there but
// unusable. A text prompt, `tokenize` and `chat` refuse it with the same words; `run --ids` goes on
// with ids only and warns.
TEST(E2ECliUsage, DamagedTokenizerIsAnErrorForTextAndAWarningForIds) {
  std::ifstream in(MK_SHARED_DIR "/models/stories260K/stories260K.gguf", std::ios::binary);
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  const size_t key = bytes.find("tokenizer.ggml.model");
  ASSERT_NE(key, std::string::npos);
  const size_t value = bytes.find("llama", key + 20);
  ASSERT_LT(value - key, 40u);
  bytes.replace(value, 5, "llamx");
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "mk_damaged_tokenizer.gguf").string();
  std::ofstream(path, std::ios::binary) << bytes;
  const std::string why = "tokenizer model \"llamx\" is not supported";

  for (const std::string& args : {"run -m " + path + " -p Once -n 2", "tokenize -m " + path + " -p Once",
                                  "run -m " + path + " --chat -p Hi -n 2", "chat -m " + path}) {
    Result r = cli(args + " </dev/null");
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_TRUE(has(r.err, "error: " + path + ": " + why)) << args << ": " << r.err;
  }
  Result r = cli("run -m " + path + " --ids 1,403 -n 2 --temp 0");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: the model's tokenizer cannot be used (" + path + ": " + why)) << r.err;
  EXPECT_TRUE(has(r.err, "); printing token ids only\n")) << r.err;
  // The generated ids, as the intact model gives them for the same prompt.
  Result intact = cli("run -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf --ids 1,403 -n 2 --temp 0 --json");
  ASSERT_EQ(intact.status, 0) << intact.err;
  const auto j = nlohmann::json::parse(intact.out);
  const auto gen = j["generated_ids"].get<std::vector<int>>();
  ASSERT_EQ(gen.size(), 2u);
  EXPECT_EQ(r.out, std::to_string(gen[0]) + " " + std::to_string(gen[1]) + "\n");
  std::filesystem::remove(path);
}

}  // namespace
