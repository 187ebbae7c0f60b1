// OLMo 2 (GGUF arch olmo2, HF model_type olmo2) against llama.cpp: the tiny model of tests/data/olmo2
// (4 layers without pre-norms, post-attention and post-FFN RMSNorms, q/k RMSNorms over the whole
// projections; 4 heads / 2 KV heads of 16; written by gen_olmo2.py, which also stores llama.cpp's
// logits at every position of a 24-token prompt and the same weights as an HF directory).
//  - GGUF logits at every position equal llama.cpp's on reference, cpu and cuda-emu (measured 5e-7 on
//    the last row), and through prefill + one-token steps on cpu and cuda-emu;
//  - the HF directory gives the GGUF's logits;
//  - the graph has no pre-norm and q/k norms as wide as the projections; a missing post-norm or q/k
//    norm is named.
#include "support/arch_fixture.h"
#include "support/cli.h"

namespace mk {
namespace {

const test::ArchFixture& fixture() { return test::arch_fixture("olmo2"); }
const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/olmo2/";
const std::string kGguf = kDir + "olmo2-tiny.f32.gguf";
constexpr double kTol = 1e-4;

class E2EOlmo2 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EOlmo2, GgufLogitsMatchLlamaCpp) { test::expect_fixture_logits(kGguf, fixture(), GetParam(), kTol); }

TEST_P(E2EOlmo2, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  test::expect_stepped_logits(kGguf, fixture(), GetParam(), kTol);
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EOlmo2, ::testing::Values("reference", "cpu", "cuda-emu"), test::backend_test_name);

std::vector<float> prompt_logits(const std::string& path, const std::string& backend) {
  return test::fixture_logits(path, fixture(), backend);
}


TEST(E2EOlmo2Hf, HfDirectoryEqualsGguf) {
  EXPECT_LT(test::rel_l2(prompt_logits(kDir + "hf", "cpu"), prompt_logits(kGguf, "cpu")), 1e-5);
}

TEST(E2EOlmo2Graph, PostNormsOnlyAndWholeProjectionQkNorms) {
  for (const std::string& path : {kGguf, kDir + "hf"}) {
    Graph g = build_graph(load_model(path), {64, true});
    int norms = 0;
    for (const Node& n : g.nodes) {
      if (n.op != Op::rms_norm) continue;
      ++norms;
      EXPECT_EQ(n.name.find("attn_norm"), std::string::npos) << n.name;
      if (n.name.ends_with(".q_norm")) {
        EXPECT_EQ(n.attr_int("group", 0), 0) << n.name;  // the whole row
      }
    }
    EXPECT_EQ(norms, 4 * 4 + 1) << path;  // q, k, post-attention, post-FFN per layer; the output norm
  }
  for (const char* drop : {"blk.2.post_ffw_norm.weight", "blk.0.attn_k_norm.weight", "blk.3.post_attention_norm.weight"}) {
    const std::string error = test::build_error(test::gguf_variant(kGguf, drop));
    EXPECT_NE(error.find(std::string("missing tensor ") + drop), std::string::npos) << drop << ": " << error;
  }
}

}  // namespace
}  // namespace mk
