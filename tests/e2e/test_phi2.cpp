// Phi-2 (GGUF arch phi2, HF model_type phi) against llama.cpp: the tiny model of tests/data/phi2
// (3 layers, n_embd 64, 4 heads of 16 with 8 rotated dims, parallel attention and MLP on one LayerNorm,
// a classifier bias; written by gen_phi2.py, which also stores llama.cpp's logits at every position
// of a 24-token prompt, the same model with q/k/v fused as attn_qkv, and an HF directory).
//  - logits at every position within 1e-3 of llama.cpp's on reference, cpu and cuda-emu (llama.cpp's
//    GELU goes through an f16 table: ours 2.7e-4 away with the f32 GELU, 1.3e-5 with --act-quant on),
//    through prefill + one-token steps on cpu and cuda-emu;
//  - the fused-qkv file and the HF directory give the same logits;
//  - without the classifier bias the logits are far from llama.cpp's; the graph's layers are parallel
//    (one norm each, attention + FFN joined); missing biases are named.
#include "support/arch_fixture.h"

namespace mk {
namespace {

const test::ArchFixture& fixture() { return test::arch_fixture("phi2"); }
const std::string kGguf = std::string(MK_SOURCE_DIR) + "/tests/data/phi2/phi2-tiny.f32.gguf";
constexpr double kTolLlamaCpp = 1e-3;

class E2EPhi2 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EPhi2, GgufLogitsMatchLlamaCpp) { test::expect_fixture_logits(kGguf, fixture(), GetParam(), kTolLlamaCpp); }

TEST_P(E2EPhi2, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  test::expect_stepped_logits(kGguf, fixture(), GetParam(), kTolLlamaCpp);
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EPhi2, ::testing::Values("reference", "cpu", "cuda-emu"), test::backend_test_name);

TEST(E2EPhi2Numerics, CpuWithLlamaCppsGeluMatchesTo3e5) {
  const std::vector<float> want = test::flat_rows(fixture().logits);
  EXPECT_LT(test::rel_l2(test::fixture_logits(kGguf, fixture(), "cpu", "on"), want), 3e-5);  // measured 1.3e-5 (all rows)
  EXPECT_GT(test::rel_l2(test::fixture_logits(kGguf, fixture(), "cpu", "off"), want), 1e-4);
}

TEST(E2EPhi2Files, FusedQkvAndHfDirectoryEqualTheGguf) {
  const std::vector<float> gguf = test::fixture_logits(kGguf, fixture(), "cpu");
  EXPECT_EQ(test::fixture_logits(fixture().dir + "phi2-fused-qkv.f32.gguf", fixture(), "cpu"), gguf);  // the same rows, as views
  EXPECT_LT(test::rel_l2(test::fixture_logits(fixture().dir + "hf", fixture(), "cpu"), gguf), 1e-6);
}

// The parallel residual and the classifier bias each matter: the bias dropped from the graph, the
// logits are far from llama.cpp's; the graph has one norm per layer and joins each layer's
// attention and FFN before the residual add.
TEST(E2EPhi2Graph, WithoutTheBiasTheLogitsDifferAndLayersAreParallel) {
  ModelFile m = load_model(kGguf);
  Graph g = build_graph(m, {64, true});
  int biased = 0;
  for (Node& n : g.nodes)
    if (n.name == "logits_all_b") {  // logits_all_b reads logits_all only
      n.op = Op::scale;
      n.inputs.resize(1);
      n.attrs = {{"s", 1.0}};
      ++biased;
    }
  ASSERT_EQ(biased, 1);
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = "f32";
  EXPECT_GT(test::rel_l2(make_backend("cpu", g, m, bo)->forward(fixture().prompt, 0), test::flat_rows(fixture().logits)),
            20 * kTolLlamaCpp);
  int norms = 0, joined = 0;
  for (const Node& n : build_graph(m, {64, true}).nodes) {
    norms += n.op == Op::layer_norm;
    joined += n.name.ends_with(".attn_ffn");
  }
  EXPECT_EQ(norms, 3 + 1);  // a norm per layer and the output norm
  EXPECT_EQ(joined, 3);
}

TEST(E2EPhi2Errors, BadFilesAreNamed) {
  auto error_of = [](const std::string& drop, const std::function<void(ModelFile&)>& change = {}) {
    return test::build_error(test::gguf_variant(kGguf, drop, change));
  };
  EXPECT_EQ(error_of(""), "");
  for (const char* t : {"output.bias", "output.weight", "blk.2.attn_k.bias", "blk.0.ffn_up.bias", "blk.1.attn_norm.bias",
                        "output_norm.bias"})
    EXPECT_NE(error_of(t).find(std::string("missing tensor ") + t), std::string::npos) << t;
  EXPECT_NE(error_of("", [](ModelFile& m) { m.metadata["phi2.attention.layer_norm_epsilon"] = 0.0; })
                .find("phi2.attention.layer_norm_epsilon = 0 must be positive"),
            std::string::npos);
  EXPECT_NE(error_of("", [](ModelFile& m) { m.metadata["phi2.rope.dimension_count"] = 17u; }).find("phi2.rope.dimension_count must be even"),
            std::string::npos);
}

}  // namespace
}  // namespace mk
