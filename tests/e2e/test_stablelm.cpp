// StableLM 2 (GGUF arch stablelm, HF model_type stablelm) against llama.cpp: the tiny model of
// tests/data/stablelm (4 layers, LayerNorms with biases, q/k/v biases, RoPE over a quarter of each
// head; 4 heads / 2 KV heads of 16; written by gen_stablelm.py, with llama.cpp's logits at every
// position of a 24-token prompt), and the same weights with attention and MLP in parallel (no
// ffn_norm: StableLM 2 12B's layout).
//  - logits at every position equal llama.cpp's on reference, cpu and cuda-emu (measured 1e-6 on the
//    last row), and through prefill + one-token steps; the parallel file's too;
//  - the HF directory gives the GGUF's logits; per-head q/k LayerNorms (12B) are refused by name; q/k/v
//    biases are in every layer or none.
#include "support/arch_fixture.h"

namespace mk {
namespace {

const test::ArchFixture& fixture() { return test::arch_fixture("stablelm"); }
const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/stablelm/";
const std::string kGguf = kDir + "stablelm-tiny.f32.gguf";
constexpr double kTol = 1e-4;

class E2EStableLM : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EStableLM, GgufLogitsMatchLlamaCpp) { test::expect_fixture_logits(kGguf, fixture(), GetParam(), kTol); }

TEST_P(E2EStableLM, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  test::expect_stepped_logits(kGguf, fixture(), GetParam(), kTol);
}

// The parallel layout: its own llama.cpp logits (far from the sequential ones).
TEST_P(E2EStableLM, ParallelLayersMatchLlamaCpp) {
  test::ArchFixture parallel = fixture();
  parallel.logits = fixture().expected.at("logits_parallel").get<std::vector<std::vector<float>>>();
  test::expect_fixture_logits(kDir + "stablelm-parallel.f32.gguf", parallel, GetParam(), kTol);
  EXPECT_GT(test::rel_l2(test::flat_rows(parallel.logits), test::flat_rows(fixture().logits)), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EStableLM, ::testing::Values("reference", "cpu", "cuda-emu"), test::backend_test_name);

TEST(E2EStableLMHf, HfDirectoryEqualsGgufAndQkLayerNormsAreRefused) {
  EXPECT_LT(test::rel_l2(test::fixture_logits(kDir + "hf", fixture(), "cpu"), test::fixture_logits(kGguf, fixture(), "cpu")), 1e-5);
  const std::string error = test::build_error(test::gguf_variant(kGguf, "", [](ModelFile& m) {
    WeightTensor t = m.get("blk.0.attn_norm.weight");  // any f32 tensor, renamed: only its presence is read
    t.name = "blk.0.attn_q_norm.weight";
    m.add_tensor(t);
  }));
  EXPECT_NE(error.find("per-head q/k LayerNorms (blk.0.attn_q_norm.weight: StableLM 2 12B) are not supported"), std::string::npos)
      << error;
  // q/k/v biases in every layer or none (a file without them builds)
  EXPECT_NE(test::build_error(test::gguf_variant(kGguf, "blk.1.attn_k.bias")).find("missing tensor blk.1.attn_k.bias"), std::string::npos);
  EXPECT_EQ(test::build_error(test::gguf_variant(kGguf, "", [](ModelFile& m) {
              ModelFile kept;
              kept.path = m.path, kept.format = m.format, kept.metadata = m.metadata;
              for (const WeightTensor& t : m.tensors())
                if (!t.name.ends_with("attn_q.bias") && !t.name.ends_with("attn_k.bias") && !t.name.ends_with("attn_v.bias")) kept.add_tensor(t);
              m = std::move(kept);
            })),
            "");
}

}  // namespace
}  // namespace mk
