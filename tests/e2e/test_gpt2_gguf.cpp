// GPT-2 from GGUF (arch gpt2, as llama.cpp's convert_hf_to_gguf.py writes it: Conv1D weights
// transposed, c_attn fused as attn_qkv, no output.weight) against llama.cpp: the tiny model of
// tests/data/gpt2 (2 layers, n_embd 48, 4 heads, 64 learned positions; written by gen_gpt2.py, which
// also stores llama.cpp's logits at every position of a 24-token prompt and the same weights as an
// HF GPT2LMHeadModel directory).
//  - logits at every position equal llama.cpp's on reference, cpu and cuda-emu (prompt at once), and on
//    cpu and cuda-emu through prefill + one-token decode steps: rel L2 1e-3, as test_gemma2.cpp
//    (llama.cpp's GELU goes through an f16 table: a numpy GPT-2 with that table is 1.4e-5 from
//    llama.cpp, with the exact GELU 3.6e-4; ours is 3e-7 from the exact numpy one);
//  - the cpu with llama.cpp's numerics (--act-quant on: the f16 GELU table) within 3e-5 (1.6e-5);
//  - the HF directory with the same weights gives the same logits as the GGUF;
//  - a file missing a bias, a bad epsilon or a context past the learned positions is named.
#include "support/arch_fixture.h"

namespace mk {
namespace {

const test::ArchFixture& fixture() { return test::arch_fixture("gpt2"); }
const std::string kGguf = std::string(MK_SOURCE_DIR) + "/tests/data/gpt2/gpt2-tiny.f32.gguf";
constexpr double kTolLlamaCpp = 1e-3;

class E2EGpt2Gguf : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EGpt2Gguf, LogitsMatchLlamaCpp) { test::expect_fixture_logits(kGguf, fixture(), GetParam(), kTolLlamaCpp); }

TEST_P(E2EGpt2Gguf, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  test::expect_stepped_logits(kGguf, fixture(), GetParam(), kTolLlamaCpp);  // the learned positions of each step's row
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EGpt2Gguf, ::testing::Values("reference", "cpu", "cuda-emu"), test::backend_test_name);

TEST(E2EGpt2GgufNumerics, CpuWithLlamaCppsGeluMatchesTo3e5) {
  const std::vector<float> want = test::flat_rows(fixture().logits);
  EXPECT_LT(test::rel_l2(test::fixture_logits(kGguf, fixture(), "cpu", "on"), want), 3e-5);  // measured 1.6e-5
  EXPECT_GT(test::rel_l2(test::fixture_logits(kGguf, fixture(), "cpu", "off"), want), 1e-4);  // the exact GELU: ~3.6e-4
}

TEST(E2EGpt2GgufHf, HfDirectoryEqualsGguf) {
  EXPECT_LT(test::rel_l2(test::fixture_logits(fixture().dir + "hf", fixture(), "cpu"), test::fixture_logits(kGguf, fixture(), "cpu")), 1e-6);
}

TEST(E2EGpt2GgufErrors, BadFilesAreNamed) {
  auto error_of = [](const std::function<void(ModelFile&)>& change, const std::string& drop = "", int64_t n_ctx = 64) {
    return test::build_error(test::gguf_variant(kGguf, drop, change), n_ctx);
  };
  EXPECT_EQ(error_of({}), "");  // the copy itself loads
  EXPECT_NE(error_of({}, "blk.1.attn_qkv.bias").find("missing tensor blk.1.attn_qkv.bias"), std::string::npos);
  EXPECT_NE(error_of({}, "blk.1.attn_qkv.weight").find("missing tensor blk.1.attn_qkv.weight (or blk.1.attn_q/attn_k/attn_v.weight)"),
            std::string::npos);
  EXPECT_NE(error_of({}, "blk.0.ffn_down.bias").find("missing tensor blk.0.ffn_down.bias"), std::string::npos);
  EXPECT_NE(error_of({}, "output_norm.bias").find("missing tensor output_norm.bias"), std::string::npos);
  EXPECT_NE(error_of({}, "position_embd.weight").find("missing tensor position_embd.weight"), std::string::npos);
  EXPECT_NE(error_of([](ModelFile& m) { m.metadata["gpt2.attention.layer_norm_epsilon"] = -1.0; })
                .find("gpt2.attention.layer_norm_epsilon = -1 must be positive"),
            std::string::npos);
  const std::string gqa = error_of([](ModelFile& m) { m.metadata["gpt2.attention.head_count_kv"] = 2; });
  EXPECT_NE(gqa.find("tensor blk.0.attn_qkv.weight has shape [144, 48], expected [96, 48]"), std::string::npos) << gqa;
  EXPECT_NE(error_of([](ModelFile& m) { m.metadata["gpt2.embedding_length"] = 47; }).find("gpt2"), std::string::npos);
  EXPECT_NE(error_of([](ModelFile& m) { m.metadata["gpt2.attention.clamp_kqv"] = 8.0; }).find("clamping of q, k and v is not supported"),
            std::string::npos);
  EXPECT_NE(error_of({}, "", 65).find("context of 65 tokens exceeds GPT-2's 64 learned positions"), std::string::npos);
}

}  // namespace
}  // namespace mk
