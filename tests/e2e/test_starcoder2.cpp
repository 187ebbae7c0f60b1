// StarCoder2 (GGUF arch starcoder2, HF model_type starcoder2) against llama.cpp: the tiny model of
// tests/data/starcoder2 (4 layers, LayerNorms and projections with biases, an ungated GELU MLP; 4 heads
// / 2 KV heads of 16; written by gen_starcoder2.py, which also stores llama.cpp's logits at every
// position of a 24-token prompt and the same weights as an HF directory).
//  - GGUF logits at every position within 1e-3 of llama.cpp's on reference, cpu and cuda-emu (5.3e-4
//    on the last row: llama.cpp's GELU goes through an f16 table; a float64 numpy StarCoder2 is 7e-7
//    from ours and, with that table, 1e-4 from llama.cpp), and through prefill + one-token steps;
//  - the HF directory gives the GGUF's logits; its sliding_window windows every layer;
//  - missing biases are named.
#include "support/arch_fixture.h"
#include "support/cli.h"

namespace mk {
namespace {

const test::ArchFixture& fixture() { return test::arch_fixture("starcoder2"); }
const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/starcoder2/";
const std::string kGguf = kDir + "starcoder2-tiny.f32.gguf";
constexpr double kTol = 1e-3;

class E2EStarcoder2 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EStarcoder2, GgufLogitsMatchLlamaCpp) { test::expect_fixture_logits(kGguf, fixture(), GetParam(), kTol); }

TEST_P(E2EStarcoder2, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  test::expect_stepped_logits(kGguf, fixture(), GetParam(), kTol);
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EStarcoder2, ::testing::Values("reference", "cpu", "cuda-emu"), test::backend_test_name);

std::vector<float> prompt_logits(const std::string& path, const std::string& backend) {
  return test::fixture_logits(path, fixture(), backend);
}


TEST(E2EStarcoder2Hf, HfDirectoryEqualsGguf) {
  EXPECT_LT(test::rel_l2(prompt_logits(kDir + "hf", "cpu"), prompt_logits(kGguf, "cpu")), 1e-5);
}

TEST(E2EStarcoder2Graph, BiasesAreRequiredAndTheHfWindowCoversEveryLayer) {
  for (const char* drop : {"blk.2.attn_k.bias", "blk.0.ffn_up.bias", "blk.3.ffn_norm.bias", "output_norm.bias"}) {
    const std::string error = test::build_error(test::gguf_variant(kGguf, drop));
    EXPECT_NE(error.find(std::string("missing tensor ") + drop), std::string::npos) << drop << ": " << error;
  }
  for (const std::string& path : {kGguf, kDir + "hf"}) {  // no window in either as written
    Graph g = build_graph(load_model(path), {64, true});
    for (const Node& n : g.nodes)
      if (n.op == Op::attention) {
        EXPECT_EQ(n.attr_int("window", 0), 0) << path;
      }
  }
  const std::string dir = testing::TempDir() + "starcoder2_window";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir + "hf/model.safetensors", dir + "/model.safetensors", std::filesystem::copy_options::overwrite_existing);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(kDir + "hf/config.json"));
  c["sliding_window"] = 8;
  std::ofstream(dir + "/config.json") << c.dump();
  int windowed = 0;
  for (const Node& n : build_graph(load_model(dir), {64, true}).nodes)
    if (n.op == Op::attention) windowed += n.attr_int("window", 0) == 8;
  EXPECT_EQ(windowed, 4);
  EXPECT_GT(test::rel_l2(prompt_logits(dir, "cpu"), test::flat_rows(fixture().logits)), 10 * kTol);
}

}  // namespace
}  // namespace mk
